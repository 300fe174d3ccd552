"""Who am I in a distributed job: rank and world size as a value, detected once.

Order of precedence: explicit arguments, an initialized ``torch.distributed``, torchrun's
environment (RANK/WORLD_SIZE/LOCAL_RANK), SLURM's (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID),
and otherwise a single process. A missing variable never raises ``KeyError``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from imgpipe.errors import DistributedError


@dataclass(frozen=True)
class DistEnv:
    """Rank identity of this process; ``source`` says where it was found."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    source: str = "single"

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise DistributedError(f"world size must be >= 1, got {self.world_size} (from {self.source})")
        if not 0 <= self.rank < self.world_size:
            raise DistributedError(f"rank {self.rank} is outside world size {self.world_size} (from {self.source})")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def detect(cls, rank: int | None = None, world_size: int | None = None, environ: Mapping[str, str] | None = None) -> "DistEnv":
        """Resolve rank and world size; explicit arguments win when both are given."""
        if (rank is None) != (world_size is None):
            raise DistributedError("give both rank and world_size, or neither")
        env = os.environ if environ is None else environ
        if rank is not None and world_size is not None:
            local = _int(env, "LOCAL_RANK", _int(env, "SLURM_LOCALID", rank))
            return cls(rank, world_size, local, _local_world_size(env, world_size), "arguments")
        from_torch = _from_torch_distributed(env)
        if from_torch is not None:
            return from_torch
        if "RANK" in env and "WORLD_SIZE" in env:
            return cls(
                _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1), _int(env, "LOCAL_RANK", 0), _int(env, "LOCAL_WORLD_SIZE", 1), "torchrun"
            )
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            ntasks = _int(env, "SLURM_NTASKS", 1)
            return cls(
                _int(env, "SLURM_PROCID", 0),
                ntasks,
                _int(env, "SLURM_LOCALID", 0),
                _int(env, "SLURM_NTASKS_PER_NODE", ntasks, first_of_list=True),
                "slurm",
            )
        return cls()


def _local_world_size(env: Mapping[str, str], world_size: int) -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE, else SLURM's tasks per node (srun sets no
    LOCAL_WORLD_SIZE), else the whole world; never more than the world."""
    local = _int(env, "LOCAL_WORLD_SIZE", 0) or _int(env, "SLURM_NTASKS_PER_NODE", 0, first_of_list=True) or world_size
    return max(1, min(local, world_size))


def _from_torch_distributed(env: Mapping[str, str]) -> DistEnv | None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    return DistEnv(
        rank, world, _int(env, "LOCAL_RANK", _int(env, "SLURM_LOCALID", rank)), _local_world_size(env, world), "torch.distributed"
    )


def _int(env: Mapping[str, str], name: str, default: int, first_of_list: bool = False) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if first_of_list:  # SLURM writes e.g. "2(x3),1"
        raw = raw.split("(")[0].split(",")[0]
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"environment variable {name}={raw!r} is not an integer") from None
