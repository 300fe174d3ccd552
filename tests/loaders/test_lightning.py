"""Both loaders, used unchanged in PyTorch Lightning: DDP on 2 CPU ranks (real Lightning, real gloo)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from imgpipe.loaders.torch import make_torch_loader
from tests._cli import run_in_group
from tests._packs import INDEXED_RECORDS as RECORDS  # one label per record, so labels name the records

pytest.importorskip("lightning", reason="lightning is a dev dependency: pip install -e '.[dev]'")

SCRIPT = Path(__file__).with_name("lightning_ddp.py")
REPO = Path(__file__).resolve().parents[2]
STEPS = RECORDS // 8  # optimizer steps (batches per rank) an epoch: 4 (37 // 8)


def seen(out: Path, name: str) -> list[list[int]]:
    """The labels each rank saw in ``name`` (a stage and an epoch), rank by rank."""
    return [[int(x) for x in (out / f"{name}-rank{rank}.txt").read_text().split()] for rank in range(2)]


def launch(data: Path, out: Path, backend: str, *mode: str) -> None:
    """Run lightning_ddp.py (2 DDP ranks, fresh processes) with its labels in ``out``."""
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = run_in_group([sys.executable, str(SCRIPT), str(data), str(out), backend, *mode], 190, cwd=out, env=env)
    assert run.returncode == 0, run.stderr[-3000:]


def batches(labels: list[int]) -> list[list[int]]:
    return [labels[i : i + 4] for i in range(0, len(labels), 4)]


def rank_batches(data: Path, epoch: int, rank: int) -> list[list[int]]:
    """Rank ``rank``'s batches of ``epoch`` on 2 ranks from the global stream on one process (world size 1, G = 2 x 4)."""
    loader = make_torch_loader(data, "train", batch_size=8, image_size=16, workers=0, rank=0, world_size=1, device="cpu")
    loader.set_epoch(epoch)
    return [labels.tolist()[4 * rank : 4 * rank + 4] for _, labels in loader]


@pytest.mark.timeout(180)
def test_lightning_ddp_trains_two_epochs_and_validates_every_sample_once(indexed: Path, tmp_path: Path, backend: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = run_in_group([sys.executable, str(SCRIPT), str(indexed), str(out), backend], 170, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    for epoch in (0, 1):
        val = seen(out, f"val-{epoch}")
        assert sorted(val[0] + val[1]) == list(range(RECORDS))  # every sample exactly once across the ranks
        train = seen(out, f"train-{epoch}")
        assert len(train[0]) == len(train[1]) == RECORDS // 2 // 4 * 4  # full batches only, the same count per rank
        assert not set(train[0]) & set(train[1])  # disjoint: no sampler of Lightning's split our batches again
    assert seen(out, "train-0") != seen(out, "train-1")  # Lightning's set_epoch and ours agree: epoch 1 is a new order


@pytest.mark.timeout(180)
def test_loaders_built_in_main_before_the_process_group_split_the_stream_over_the_ranks(
    indexed: Path, tmp_path: Path, backend: str
) -> None:
    """``trainer.fit(model, train_dataloaders=loader, val_dataloaders=...)`` with the loaders built in ``__main__``:
    each rank trains on its own part of the global stream, and validation sees every sample once."""
    out = tmp_path / "out"
    launch(indexed, out, backend, "main")
    for rank in range(2):
        assert json.loads((out / f"start-rank{rank}.json").read_text())["num_training_batches"] == STEPS
    for epoch in (0, 1):
        val = seen(out, f"val-{epoch}")
        assert sorted(val[0] + val[1]) == list(range(RECORDS))  # every sample exactly once across the ranks
        for rank in range(2):
            assert batches(seen(out, f"train-{epoch}")[rank]) == rank_batches(indexed, epoch, rank)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_lightning_ddp_resumes_a_mid_epoch_checkpoint_where_the_stream_stopped(indexed: Path, tmp_path: Path, backend: str) -> None:
    first, ckpts = tmp_path / "first", tmp_path / "ckpt"
    launch(indexed, first, backend, "save", str(ckpts), "2")  # 2 epochs, uninterrupted, a checkpoint every 2 steps
    assert sorted(ckpt.name for ckpt in ckpts.glob("*.ckpt")) == [f"step={step}.ckpt" for step in (2, 4, 6, 8)]
    expected = [[rank_batches(indexed, epoch, rank) for epoch in range(3)] for rank in range(2)]
    for rank in range(2):
        assert batches(seen(first, "train-0")[rank]) == expected[rank][0]  # the uninterrupted run is the global stream
        assert batches(seen(first, "train-1")[rank]) == expected[rank][1]

    # step 6: 2 of epoch 1's 4 batches done (mid-epoch); step 4: epoch 0 done on its last batch (ModelCheckpoint's
    # on_train_batch_end, before the epoch ends)
    for step, position in ((STEPS + 2, (1, 2)), (STEPS, (1, 0))):
        ckpt, resumed = ckpts / f"step={step}.ckpt", tmp_path / f"resumed-{step}"
        # Lightning saved the train loader's state_dict (rank 0's; every rank's is the same global position)
        saved = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        assert [(state["epoch"], state["batches"]) for state in saved] == [position]
        launch(indexed, resumed, backend, "resume", str(ckpt))  # fresh processes and loaders: fit(ckpt_path=...) through epoch 2
        done = step - STEPS  # batches of epoch 1 trained before the checkpoint
        for rank in range(2):
            start = json.loads((resumed / f"start-rank{rank}.json").read_text())
            assert (start["epoch"], start["batches"]) == position  # Lightning called load_state_dict before training started
            assert not (resumed / f"train-0-rank{rank}.txt").exists()
            # the rest of epoch 1 exactly: the batches after the checkpoint, none again, none missing (Lightning skips none itself)
            assert batches(seen(resumed, "train-1")[rank]) == expected[rank][1][done:]
            assert batches(seen(resumed, "train-2")[rank]) == expected[rank][2]  # then epoch 2 from its start, a new order
        for epoch in (1, 2):
            val = seen(resumed, f"val-{epoch}")
            assert sorted(val[0] + val[1]) == list(range(RECORDS))
