"""Time to accuracy in the trainer: a resolution ramp, validation at its own size with flip TTA, EMA metrics,
wall time in every epoch line and record, the target top-1, a resume mid-ramp, one compiled graph."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from train_cli import VAL_RECORDS, epochs_of, imgpipe_train, one_line_error, write_config

RAMP = ["data.resolution=[32, 48, 48]", "data.val_image_size=48", "data.val_flip_tta=true", "train.ema=true", "train.ema_decay=0.5"]


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_ramp_reports_wall_time_resolution_and_ema_in_every_epoch(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed)
    done = imgpipe_train(config, "--gpus", "0", "--nproc", "2", *sets(*RAMP, "train.target_top1=1.0"))
    assert done.returncode == 0, done.stderr[-3000:]
    epochs = epochs_of(tmp_path / "run")
    assert [e["resolution"] for e in epochs] == [32, 48, 48] and {e["val_resolution"] for e in epochs} == {48}
    assert 0 < epochs[0]["wall_s"] < epochs[1]["wall_s"] < epochs[2]["wall_s"]
    assert all(e["val_samples"] == e["ema_val_samples"] == VAL_RECORDS and 0 <= e["ema_val_top1"] <= 1 for e in epochs)
    assert any(e["ema_val_loss"] != e["val_loss"] for e in epochs)  # two sets of weights validated
    lines = [line for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert [re.search(r", ([\d.]+) s, (\d+) px,", line).group(2) for line in lines] == ["32", "48", "48"]
    assert (
        done.stdout.count(f"ema val: {VAL_RECORDS} samples at 48 px") == 3
        and done.stdout.count(f"val: {VAL_RECORDS} samples at 48 px") == 6
    )
    final = done.stdout.strip().splitlines()[-1]
    assert final.startswith("done: 3 epoch(s), 15 steps in ") and ", EMA val top-1 " in final
    assert ("target top-1 1.0000 not reached" in final) == all(max(e["val_top1"], e["ema_val_top1"]) < 1.0 for e in epochs)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_run_stops_at_its_target_and_says_when(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed)
    done = imgpipe_train(config, "--gpus", "0", "--nproc", "2", *sets("train.target_top1=0.01"))
    assert done.returncode == 0, done.stderr[-3000:]
    (epoch,) = epochs_of(tmp_path / "run")  # any model beats 1 % on 4 classes: the first epoch reaches it
    assert epoch["target_reached"]["epoch"] == 0 and epoch["target_reached"]["wall_s"] == epoch["wall_s"]
    assert f"target top-1 0.0100 reached at epoch 0 after {epoch['wall_s']:.1f} s" in done.stdout
    final = done.stdout.strip().splitlines()[-1]
    assert (
        final.startswith("done: 1 epoch(s), 5 steps") and f"; target top-1 0.0100 reached at epoch 0 after {epoch['wall_s']:.1f} s" in final
    )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_stopped_mid_ramp_resumes_on_another_rank_count_at_the_schedules_size(packed: Path, tmp_path: Path) -> None:
    """G = 32: 5 steps per epoch; stopped at step 7 (epoch 1, 48 px) on 2 ranks, resumed on 1 with 32 per rank."""
    config = write_config(tmp_path, packed, validate=False)
    first = imgpipe_train(config, "--gpus", "0", "--nproc", "2", *sets(*RAMP, "train.max_steps=7"))
    assert first.returncode == 0, first.stderr[-3000:]
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert (saved["epoch"], saved["epoch_step"], saved["loader"]["resolution"]) == (1, 2, 48)
    assert saved["ema"] is not None and saved["wall_s"] > 0
    second = imgpipe_train(tmp_path / "run" / "config.yaml", "--gpus", "0", "--resume", "--set", "train.max_steps=null")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed at epoch 1, global batch 2, on 1 rank (was 2); per-rank batch 32 (was 16)" in second.stderr
    epochs = epochs_of(tmp_path / "run")
    assert [(e["epoch"], e["resolution"]) for e in epochs] == [(0, 32), (1, 48), (2, 48)]
    assert epochs[1]["train_samples"] == 3 * 32 and epochs[1]["wall_s"] > saved["wall_s"]  # the time before the stop counts
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["resolution"] == [32, 48, 48]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_trainer_compiles_one_training_graph_for_the_whole_ramp(packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process (one rank, no launcher), with dynamo's counting backend in place of inductor."""
    from torch._dynamo.testing import CompileCounter

    from imgpipe.train import compiling, run
    from imgpipe.train.config import load_config

    counter = CompileCounter()
    monkeypatch.setattr(compiling, "BACKEND", counter)
    config = load_config(
        write_config(tmp_path, packed, validate=False, batch_size=32),
        ["data.resolution=[32, 40, 48, 56]", "train.epochs=4", "train.compile=true"],
    )
    torch._dynamo.reset()
    try:
        result = run(config, gpus=0)
    finally:
        torch._dynamo.reset()
    assert result.epochs_completed == 4 and [e["resolution"] for e in epochs_of(tmp_path / "run")] == [32, 40, 48, 56]
    # compiled (a trainer that stops compiling leaves the counter at 0), and at most 2 graphs, not one per
    # size: at 32 px ResNet's last feature map is 1 x 1, and dynamo specializes that first graph on it
    # (its guard: 2 <= height <= 32); every larger size then runs the second
    assert 1 <= counter.frame_count <= 2 and counter.op_count > 0, f"{counter.frame_count} compiled graphs for 4 resolutions"


def test_flip_tta_averages_the_logits_of_the_image_and_its_mirror() -> None:
    from imgpipe.train.validation import val_logits

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5)).eval()
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(val_logits(model, x, True), (model(x) + model(x.flip(3))) / 2)
    torch.testing.assert_close(val_logits(model, x, True), val_logits(model, x.flip(3), True))  # mirror-invariant
    assert not torch.allclose(val_logits(model, x, False), val_logits(model, x.flip(3), False))


@pytest.mark.timeout(300)
def test_a_run_with_mixup_cutmix_and_blurpool_mixes_the_loaders_records_and_saves_the_blur(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One CPU rank, one epoch of 5 steps: the mixed batches are the loader's records (each train record once),
    their soft targets the draws of those records, the loss finite, and the checkpoint holds the blur."""
    from imgpipe.train import mixing, run
    from imgpipe.train.config import load_config

    calls = []
    apply = mixing.Mixing.apply

    def spy(self: mixing.Mixing, images: torch.Tensor, labels: torch.Tensor, records, epoch: int, classes: int):
        mixed, targets = apply(self, images, labels, records, epoch, classes)
        calls.append((self, epoch, images.shape[-1], np.array(records), labels.clone(), targets.clone()))
        return mixed, targets

    monkeypatch.setattr(mixing.Mixing, "apply", spy)
    items = ["train.epochs=1", "train.mixup_alpha=0.4", "train.cutmix_alpha=1.0", "model.blurpool=true"]
    result = run(load_config(write_config(tmp_path, packed, validate=False, batch_size=32), items), gpus=0)
    assert result.epochs_completed == 1 and len(calls) == 5 and np.isfinite(result.train_loss[0])
    records = np.concatenate([c[3] for c in calls])
    assert sorted(records.tolist()) == list(range(160)) and not np.array_equal(records, np.arange(160))  # the loader's shuffled records
    kinds = set()
    for mix, epoch, size, records, labels, targets in calls:
        torch.testing.assert_close(targets.sum(1), torch.ones(len(records)))
        for k, record in enumerate(records.tolist()):
            draw = mix.draw(epoch, record, size)
            kinds.add(draw.cutmix)
            want = torch.zeros(targets.shape[1])
            want[labels[k]] += draw.lam
            want[labels[k ^ 1]] += 1 - draw.lam
            torch.testing.assert_close(targets[k], want)
    assert kinds == {False, True} and any((t.max(1).values < 0.99).any() for *_, t in calls)  # both kinds ran, the targets soft
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
    blurred = sorted(key for key in saved if key.endswith(".blur_filter"))
    # resnet18 strides in conv1 and downsample.0 of the first block of layers 2-4
    assert blurred == sorted(f"layer{i}.0.{part}.blur_filter" for i in (2, 3, 4) for part in ("conv1", "downsample.0"))
    kernel = torch.tensor([1.0, 2.0, 1.0])
    assert torch.equal(saved["layer2.0.conv1.blur_filter"][0, 0], torch.outer(kernel, kernel) / 16)


@pytest.mark.timeout(120)
def test_mixing_with_an_odd_per_rank_batch_is_refused_in_one_line(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed, validate=False, batch_size=15)
    done = imgpipe_train(config, "--gpus", "0", *sets("train.cutmix_alpha=1.0"))
    one_line_error(done, "per-rank batch must be even, not 15", "train.batch_size or train.global_batch_size")
