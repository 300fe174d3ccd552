"""The trainer's loaders size themselves by the ranks of this node, also under srun (no LOCAL_WORLD_SIZE)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgpipe.distenv import DistEnv
from imgpipe.loaders.common import open_for_rank
from imgpipe.loaders.options import LoaderOptions

# what srun exports to task 5 of a 2-node job with 4 tasks per node; no LOCAL_WORLD_SIZE
SLURM_2_NODES = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_NNODES": "2"}


def test_explicit_rank_and_world_take_the_node_size_from_slurm() -> None:
    env = DistEnv.detect(rank=5, world_size=8, environ=SLURM_2_NODES)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)


def test_torchrun_local_world_size_still_wins_and_nothing_set_is_the_world() -> None:
    assert DistEnv.detect(rank=5, world_size=8, environ={**SLURM_2_NODES, "LOCAL_WORLD_SIZE": "2"}).local_world_size == 2
    assert DistEnv.detect(rank=1, world_size=2, environ={}).local_world_size == 2
    # an salloc shell's variables never make the node bigger than the job
    assert DistEnv.detect(rank=0, world_size=1, environ=SLURM_2_NODES).local_world_size == 1


def test_the_loader_of_a_slurm_rank_sees_its_node(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As train/data.py builds it: rank and world size passed explicitly, the node size from srun's variables."""
    for name, value in SLURM_2_NODES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    options = LoaderOptions(batch_size=4, image_size=32, rank=5, world_size=8, device=None)
    env, _ = open_for_rank(packed, options)
    assert (env.rank, env.world_size, env.local_world_size) == (5, 8, 4)
