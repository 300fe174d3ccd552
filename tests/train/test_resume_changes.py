"""`--resume` with another grad_accum, batch size or optim setting: applied where the data stream allows, else one line.

160 train records, batch 16 on one rank: 10 global batches per epoch. Real runs of the trainer
on the torch loader (or the in-memory batches, where only the optimizer matters).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from train_cli import SYNTHETIC, epochs_of, imgpipe_train, one_line_error, write_config

ONE_RANK = ("--gpus", "0")


def saved(run: Path) -> dict:
    return torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)


def step_records(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"}


def start(tmp_path: Path, packed: Path, max_steps: int, **train: object) -> tuple[Path, Path]:
    config = write_config(tmp_path, packed, epochs=2, validate=False, **train)
    first = imgpipe_train(config, *ONE_RANK, "--set", f"train.max_steps={max_steps}")
    assert first.returncode == 0, first.stderr[-3000:]
    return config, tmp_path / "run"


@pytest.mark.timeout(300)
def test_resumed_mid_epoch_with_twice_the_grad_accum_the_epoch_ends(packed: Path, tmp_path: Path) -> None:
    """Saved after 4 of 10 batches in steps of 1; resumed in steps of 2: 3 steps finish epoch 0 (it used to restart forever)."""
    config, run = start(tmp_path, packed, max_steps=4)
    assert (saved(run)["epoch_step"], saved(run)["loader"]["batches"]) == (4, 4)
    resumed = imgpipe_train(config, *ONE_RANK, "--resume", "--set", "train.grad_accum=2", timeout=150)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "at epoch 0, step 2" in resumed.stderr  # 4 batches = 2 steps of 2
    assert "from the config: train.max_steps 4 -> None, train.grad_accum 1 -> 2" in resumed.stderr
    assert "done: 2 epoch(s), 10 steps" in resumed.stdout  # 2 + 3 in epoch 0, then 5 of 2 batches
    assert [(e["epoch"], e["train_samples"]) for e in epochs_of(run)] == [(0, 6 * 16), (1, 160)]

    config, run = start(tmp_path / "odd", packed, max_steps=5)  # 5 batches: not a whole number of steps of 2 (it restarted forever)
    refused = imgpipe_train(config, *ONE_RANK, "--resume", "--set", "train.grad_accum=2", timeout=90)
    one_line_error(refused, "global batch 16 x train.grad_accum 2 = 32 records per step", "after 80 records", "train.max_steps: 10")


@pytest.mark.timeout(300)
def test_resumed_mid_epoch_with_half_the_grad_accum_no_batch_is_read_twice(packed: Path, tmp_path: Path) -> None:
    """Saved after 2 steps of 2 batches; resumed in steps of 1: the 6 batches left, not 2 of them again."""
    config, run = start(tmp_path, packed, max_steps=2, grad_accum=2)
    assert (saved(run)["epoch_step"], saved(run)["loader"]["batches"]) == (2, 4)
    resumed = imgpipe_train(config, *ONE_RANK, "--resume", "--set", "train.grad_accum=1", timeout=150)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at epoch 0, step 4" in resumed.stderr
    assert "done: 2 epoch(s), 20 steps" in resumed.stdout
    assert [(e["epoch"], e["train_samples"]) for e in epochs_of(run)] == [(0, 6 * 16), (1, 160)]  # re-read: 2 x 16 after a restart


@pytest.mark.timeout(300)
def test_resume_applies_a_new_batch_size_where_the_position_allows_and_says_why_not_elsewhere(packed: Path, tmp_path: Path) -> None:
    """The docs' ``--set train.batch_size=... --resume``: after 64 records, batches of 32 continue the same epoch."""
    from imgpipe.train.config import load_config
    from imgpipe.train.optim import lr_schedule

    config, run = start(tmp_path, packed, max_steps=4)
    resumed = imgpipe_train(config, *ONE_RANK, "--resume", "--set", "train.batch_size=32", "--set", "train.epochs=1", timeout=150)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "per-rank batch 32 (was 16); global batch size 32 (was 16)" in resumed.stderr
    assert "done: 1 epoch(s), 5 steps" in resumed.stdout  # 64 records = 2 steps of 32, then the 3 left of 5
    assert saved(run)["global_batch"] == 32 and epochs_of(run)[0]["train_samples"] == 96
    schedule = lr_schedule(load_config(config, ["train.epochs=1"]), steps_per_epoch=5)
    lrs = {step: r["lr"] for step, r in step_records(run).items()}
    assert [lrs[s] for s in (3, 4, 5)] == pytest.approx([0.1 * 32 / 256 * schedule(s) for s in (3, 4, 5)])  # the lr of G = 32

    config, run = start(tmp_path / "odd", packed, max_steps=5)  # 80 records: not a whole number of batches of 32
    refused = imgpipe_train(config, *ONE_RANK, "--resume", "--set", "train.batch_size=32")
    one_line_error(
        refused, "cannot resume with global batch 32 x train.grad_accum 1 = 32 records per step", "after 80 records", "train.max_steps: 10"
    )
    assert saved(run)["step"] == 5  # nothing was written


@pytest.mark.timeout(300)
def test_resume_applies_a_new_base_lr_and_says_so(packed: Path, tmp_path: Path) -> None:
    from imgpipe.train.config import load_config
    from imgpipe.train.optim import lr_schedule

    config = write_config(tmp_path, packed, epochs=1, validate=False)
    first = imgpipe_train(config, *SYNTHETIC, "--set", "train.max_steps=3")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = imgpipe_train(config, *SYNTHETIC, "--resume", "--set", "optim.base_lr=0.05", "--set", "optim.weight_decay=0.0")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "from the config: optim.base_lr 0.1 -> 0.05, optim.weight_decay 0.0001 -> 0.0" in resumed.stderr
    schedule = lr_schedule(load_config(config), steps_per_epoch=10)
    lrs = {step: r["lr"] for step, r in step_records(tmp_path / "run").items()}
    assert sorted(lrs) == list(range(1, 11))
    assert [lrs[s] for s in (1, 2, 3)] == pytest.approx([0.1 * 16 / 256 * schedule(s) for s in (1, 2, 3)])
    assert [lrs[s] for s in range(4, 11)] == pytest.approx([0.05 * 16 / 256 * schedule(s) for s in range(4, 11)])
    groups = saved(tmp_path / "run")["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.0, 0.0] and groups[0]["initial_lr"] == pytest.approx(0.05 * 16 / 256)


@pytest.mark.timeout(300)
def test_resumed_where_the_new_steps_already_end_the_epoch_it_reads_nothing_more_and_goes_on(packed: Path, tmp_path: Path) -> None:
    """After 8 of 10 batches of 16 (128 records), steps of 32 x 2 = 64 records: epoch 0 has 2 such steps, both done."""
    config = write_config(tmp_path, packed, epochs=2, validate=False)
    first = imgpipe_train(config, *SYNTHETIC, "--set", "train.max_steps=8")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = imgpipe_train(config, *SYNTHETIC, "--resume", "--set", "train.batch_size=32", "--set", "train.grad_accum=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at epoch 0, step 2" in resumed.stderr and "done: 2 epoch(s), 4 steps" in resumed.stdout
    assert [(e["epoch"], e["train_samples"]) for e in epochs_of(tmp_path / "run")] == [(0, 0), (1, 4 * 32)]


@pytest.mark.timeout(300)
def test_a_run_saved_before_resume_was_a_boolean_resumes_from_its_config_yaml(packed: Path, tmp_path: Path) -> None:
    """Before, config.yaml and the checkpoint's config held output.resume as the strings 'yes'/'no' (saved quoted by YAML)."""
    import yaml

    config = write_config(tmp_path, packed, epochs=1, validate=False)
    first = imgpipe_train(config, *SYNTHETIC, "--set", "train.max_steps=3")
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "run"
    old = yaml.safe_load((run / "config.yaml").read_text())
    old["output"]["resume"] = "yes"  # as a run started with --resume saved it
    (run / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    assert "resume: 'yes'" in (run / "config.yaml").read_text()
    checkpoint = saved(run)
    checkpoint["config"]["output"]["resume"] = "yes"
    torch.save(checkpoint, run / "checkpoint.pt")

    resumed = imgpipe_train(run / "config.yaml", *SYNTHETIC, "--set", "train.max_steps=5")  # no --resume: the file's 'yes' resumes
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{run / 'config.yaml'}: output.resume 'yes' is read as true; write true" in resumed.stderr
    (line,) = [line for line in resumed.stderr.splitlines() if "resumed at epoch 0" in line]
    assert line.endswith("per-rank batch 16; from the config: train.max_steps 3 -> 5"), line  # nothing else reads as changed
    assert sorted(step_records(run)) == [1, 2, 3, 4, 5]
