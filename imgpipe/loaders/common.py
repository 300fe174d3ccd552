"""What both loaders do before they differ: find the rank, open the shards, and place this rank in
the global stream (``open_rank_stream``), as their ``LoaderOptions`` say."""

from __future__ import annotations

import os
from typing import NamedTuple

from imgpipe._sys.cpus import available_cpus
from imgpipe.cache.opening import open_shards
from imgpipe.distenv import DistEnv
from imgpipe.errors import ConfigError, DatasetError
from imgpipe.format.shardset import ShardSet
from imgpipe.loaders.geometry import EvalGeometry, TrainGeometry
from imgpipe.loaders.options import LoaderOptions
from imgpipe.loaders.sampler import EpochSampler

FULL_BATCH_FIX = "lower batch_size or use remainder='pad'"


def default_workers(local_world_size: int = 1) -> int:
    """min(8, the CPUs available to this process divided among the local ranks), at least 1."""
    return max(1, min(8, available_cpus() // max(1, local_world_size)))


def open_for_rank(path: object, options: LoaderOptions) -> tuple[DistEnv, ShardSet]:
    """Resolve this rank and open ``path`` (or take a ShardSet as it is), through ``options.cache_dir`` if given."""
    env = DistEnv.detect(options.rank, options.world_size)
    if isinstance(path, ShardSet):
        if options.cache_dir is not None:
            raise ConfigError("cache_dir applies to a URL: give the URL itself with cache_dir, or open_shards(url, split, cache_dir=...)")
        return env, path
    paths = [path] if isinstance(path, (str, os.PathLike)) else path
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise ConfigError(
            f"path must be a packed folder, a .rec file, a glob, a list of .rec files or a ShardSet, got {path!r} ({type(path).__name__})"
        )
    return env, open_shards(path, options.split, cache_dir=options.cache_dir)  # type: ignore[arg-type]


def no_full_batch(path: object, split: str, records: int, world_size: int, batch_size: int, fix: str) -> DatasetError:
    """The error for a train split too small to give each rank one full batch."""
    return DatasetError(
        f"{path}: split {split!r} has {records} records: {records // world_size} per rank over "
        f"{world_size} ranks, not one full batch of {batch_size}; {fix}"
    )


class RankStream(NamedTuple):
    """This rank, its shards, its part of the global stream and the geometry of its samples."""

    env: DistEnv
    shards: ShardSet
    sampler: EpochSampler
    geometry: TrainGeometry | EvalGeometry


def open_rank_stream(path: object, options: LoaderOptions) -> RankStream:
    """Open ``path`` for this rank and build its ``EpochSampler``; a split without records, or a train split
    without one full batch per rank, is one ``DatasetError``."""
    env, shards = open_for_rank(path, options)
    if len(shards) == 0:
        raise DatasetError(f"split {options.split!r} of {path} has no records")
    sampler = EpochSampler(
        len(shards),
        batch_size=options.batch_size,
        train=options.train,
        shuffle=options.shuffle,
        seed=options.seed,
        rank=env.rank,
        world_size=env.world_size,
        remainder=options.remainder,
        block_size=options.block_shuffle,
        window=options.shuffle_window,
        resolution=options.image_size,
    )
    if options.train and len(sampler) == 0:
        raise no_full_batch(path, options.split, len(shards), env.world_size, options.batch_size, FULL_BATCH_FIX)
    geometry = (
        TrainGeometry(image_size=options.image_size)
        if options.train
        else EvalGeometry(image_size=options.image_size, crop_fraction=options.crop_ratio)
    )
    shards.labels  # noqa: B018  (bare .rec files: read header labels once here, not in every worker)
    return RankStream(env, shards, sampler, geometry)
