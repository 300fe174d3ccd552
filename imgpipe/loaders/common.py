"""What both loaders do before they differ: check the shared arguments, find the rank, open the shards."""

from __future__ import annotations

from imgpipe.distenv import DistEnv, available_cpus
from imgpipe.errors import ConfigError, DatasetError
from imgpipe.shards import ShardSet, open_shards


def default_workers(local_world_size: int = 1) -> int:
    """min(8, the CPUs available to this process divided among the local ranks), at least 1."""
    return max(1, min(8, available_cpus() // max(1, local_world_size)))


def open_for_rank(path: object, split: str, *, image_size: int, rank: int | None, world_size: int | None) -> tuple[DistEnv, ShardSet]:
    """Validate ``image_size``, resolve this rank, and open ``path`` (or take a ShardSet as it is)."""
    if image_size < 1:
        raise ConfigError(f"image_size must be >= 1, got {image_size}")
    env = DistEnv.detect(rank, world_size)
    shards = path if isinstance(path, ShardSet) else open_shards(path, split)  # type: ignore[arg-type]
    return env, shards


def no_full_batch(path: object, split: str, records: int, world_size: int, batch_size: int, fix: str) -> DatasetError:
    """The error for a train split too small to give each rank one full batch."""
    return DatasetError(
        f"{path}: split {split!r} has {records} records: {records // world_size} per rank over "
        f"{world_size} ranks, not one full batch of {batch_size}; {fix}"
    )
