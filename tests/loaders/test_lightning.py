"""Both loaders, used unchanged in PyTorch Lightning: DDP on 2 CPU ranks (real Lightning, real gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._tiny_shards import make_tiny_pack

pytest.importorskip("lightning", reason="lightning is a dev dependency: pip install -e '.[dev]'")

RECORDS = 36  # one label per record, so labels name the records
SCRIPT = Path(__file__).with_name("lightning_ddp.py")
REPO = Path(__file__).resolve().parents[2]


def seen(out: Path, name: str) -> list[list[int]]:
    """The labels each rank saw in ``name`` (a stage and an epoch), rank by rank."""
    return [[int(x) for x in (out / f"{name}-rank{rank}.txt").read_text().split()] for rank in range(2)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["torch", pytest.param("dali", marks=pytest.mark.dali)])
def test_lightning_ddp_trains_two_epochs_and_validates_every_sample_once(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "dali":
        request.getfixturevalue("require_dali")
    data = make_tiny_pack(tmp_path / "tiny", records=RECORDS, shards=2, classes=RECORDS, min_side=20, max_side=40)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(SCRIPT), str(data), str(out), backend], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    for epoch in (0, 1):
        val = seen(out, f"val-{epoch}")
        assert sorted(val[0] + val[1]) == list(range(RECORDS))  # every sample exactly once across the ranks
        train = seen(out, f"train-{epoch}")
        assert len(train[0]) == len(train[1]) == RECORDS // 2 // 4 * 4  # full batches only, the same count per rank
        assert not set(train[0]) & set(train[1])  # disjoint: no sampler of Lightning's split our batches again
    assert seen(out, "train-0") != seen(out, "train-1")  # Lightning's set_epoch and ours agree: epoch 1 is a new order
