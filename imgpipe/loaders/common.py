"""What both loaders do before they differ: check the arguments, find the rank, open the shards,
and place this rank in the global stream (``open_rank_stream``).

Every public argument is checked here, once for both loaders: a mistake is one ``ConfigError`` naming
the argument and what it accepts, never a TypeError or a torch error from deep inside. ``device``
defaults to ``CURRENT_DEVICE`` (the current CUDA device when torch sees one, else the CPU);
``device=None`` means the CPU.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import numpy as np

from imgpipe._sys.distenv import DistEnv, available_cpus
from imgpipe.cache.opening import open_shards
from imgpipe.errors import ConfigError, DatasetError
from imgpipe.format.shardset import ShardSet
from imgpipe.loaders.geometry import EVAL_CROP_FRACTION, EvalGeometry, TrainGeometry
from imgpipe.loaders.sampler import REMAINDER_POLICIES, EpochSampler

if TYPE_CHECKING:
    import torch

ON_CORRUPT = ("raise", "skip")  # what a loader does with a record it cannot decode
FULL_BATCH_FIX = "lower batch_size or use remainder='pad'"


class _CurrentDevice:
    """The type of ``CURRENT_DEVICE``, the loaders' default ``device``: distinct from None (the CPU)."""

    def __repr__(self) -> str:
        return "CURRENT_DEVICE"


CURRENT_DEVICE: Any = _CurrentDevice()  # typed Any so it fits a ``device: str | torch.device | None`` parameter


def default_device(cuda_available: bool, current_index: Callable[[], int]) -> str:
    """The device a loader uses when none is named: ``cuda:<current>`` when CUDA is available, else the CPU.

    Takes its inputs (``torch.cuda.is_available()`` and ``torch.cuda.current_device``) as
    arguments so the choice is testable on a machine without a GPU.
    """
    return f"cuda:{current_index()}" if cuda_available else "cpu"


def default_workers(local_world_size: int = 1) -> int:
    """min(8, the CPUs available to this process divided among the local ranks), at least 1."""
    return max(1, min(8, available_cpus() // max(1, local_world_size)))


def check_int(name: str, value: object, *, minimum: int, accepted: str = "") -> int:
    """``value`` as an int >= ``minimum``; bools, floats and strings are refused."""
    accepted = accepted or f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be {accepted}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_optional_int(name: str, value: object, *, minimum: int) -> int | None:
    """None, or ``value`` as an int >= ``minimum``."""
    return None if value is None else check_int(name, value, minimum=minimum, accepted=f"an integer >= {minimum} or None")


def check_bool(name: str, value: object, *, accepted: str = "True or False") -> bool:
    """``value`` as a bool; 0/1 and strings are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be {accepted}, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_optional_bool(name: str, value: object) -> bool | None:
    """None, or ``value`` as a bool."""
    return None if value is None else check_bool(name, value, accepted="True, False or None")


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def resolve_device(device: object) -> "torch.device":
    """The device batches go to: the CPU for None/"cpu"; a visible CUDA device, with its index, for "cuda"/"cuda:N";
    ``default_device`` for ``CURRENT_DEVICE``.

    A bare "cuda" becomes the current CUDA device, so the loader keeps using the GPU it was
    built on even if the caller switches devices later.
    """
    import torch

    accepted = "None, 'cpu', 'cuda' or 'cuda:N' (or a torch.device of those)"
    if device is CURRENT_DEVICE:
        device = default_device(torch.cuda.is_available(), torch.cuda.current_device)
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device must be {accepted}, got {device!r} ({type(device).__name__})")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"device {device!r} is not a torch device; use {accepted} ({str(e).splitlines()[0]})") from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise ConfigError(f"device {device!r}: the loaders run on {accepted}")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but torch sees no CUDA GPU; use device=None to load on the CPU")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if resolved.index is None else resolved.index
    if index >= count:
        raise ConfigError(f"device {device!r}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


@dataclass(frozen=True)
class LoaderArgs:
    """The arguments both loaders share, checked and normalized (ints are ints, the device has its index)."""

    split: str
    batch_size: int
    train: bool
    image_size: int
    workers: int | None
    seed: int
    rank: int | None
    world_size: int | None
    device: "torch.device"
    normalize: bool
    channels_last: bool
    crop_ratio: float = EVAL_CROP_FRACTION


def check_ratio(name: str, value: object) -> float:
    """``value`` as a float in (0, 1]; bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise ConfigError(f"{name} must be a number in (0, 1], such as 224/256 = 0.875, got {value!r}")
    return float(value)


def check_loader_args(
    *,
    split: object,
    batch_size: object,
    train: object,
    image_size: object,
    workers: object,
    seed: object,
    rank: object,
    world_size: object,
    device: object,
    normalize: object,
    channels_last: object,
    crop_ratio: object = EVAL_CROP_FRACTION,
) -> LoaderArgs:
    """Check the shared loader arguments; the first mistake is a ConfigError naming it."""
    if not isinstance(split, str) or not split:
        raise ConfigError(f"split must be a split name such as 'train' or 'val', got {split!r}")
    return LoaderArgs(
        split=split,
        batch_size=check_int("batch_size", batch_size, minimum=1),
        train=check_bool("train", train),
        image_size=check_int("image_size", image_size, minimum=1),
        workers=check_optional_int("workers", workers, minimum=0),
        seed=check_int("seed", seed, minimum=0),
        rank=check_optional_int("rank", rank, minimum=0),
        world_size=check_optional_int("world_size", world_size, minimum=1),
        device=resolve_device(device),
        normalize=check_bool("normalize", normalize),
        channels_last=check_bool("channels_last", channels_last),
        crop_ratio=check_ratio("crop_ratio", crop_ratio),
    )


def open_for_rank(path: object, args: LoaderArgs, cache_dir: object = None) -> tuple[DistEnv, ShardSet]:
    """Resolve this rank and open ``path`` (or take a ShardSet as it is), through ``cache_dir`` if given."""
    env = DistEnv.detect(args.rank, args.world_size)
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise ConfigError(f"cache_dir must be a local folder (a str or path) or None, got {cache_dir!r} ({type(cache_dir).__name__})")
    if isinstance(path, ShardSet):
        if cache_dir is not None:
            raise ConfigError("cache_dir applies to a URL: give the URL itself with cache_dir, or open_shards(url, split, cache_dir=...)")
        return env, path
    paths = [path] if isinstance(path, (str, os.PathLike)) else path
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise ConfigError(
            f"path must be a packed folder, a .rec file, a glob, a list of .rec files or a ShardSet, got {path!r} ({type(path).__name__})"
        )
    return env, open_shards(path, args.split, cache_dir=cache_dir)  # type: ignore[arg-type]


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


def open_rank_stream(
    path: object,
    args: LoaderArgs,
    *,
    remainder: object,
    shuffle: object,
    block_shuffle: object,
    shuffle_window: object,
    cache_dir: object = None,
) -> RankStream:
    """Check the sampling arguments (as each loader documents them), open ``path`` for this rank (through
    ``cache_dir``) and build its ``EpochSampler``; a split without records, or a train split without one
    full batch per rank, is one ``DatasetError``."""
    remainder = check_choice("remainder", remainder, REMAINDER_POLICIES)
    shuffle = check_optional_bool("shuffle", shuffle)
    block_shuffle = check_optional_int("block_shuffle", block_shuffle, minimum=1)
    shuffle_window = check_optional_int("shuffle_window", shuffle_window, minimum=1)
    if shuffle_window is not None and block_shuffle is None:
        raise ConfigError("shuffle_window only applies with block_shuffle; set block_shuffle too, or leave shuffle_window None")
    env, shards = open_for_rank(path, args, cache_dir)
    if len(shards) == 0:
        raise DatasetError(f"split {args.split!r} of {path} has no records")
    sampler = EpochSampler(
        len(shards),
        batch_size=args.batch_size,
        train=args.train,
        shuffle=shuffle,
        seed=args.seed,
        rank=env.rank,
        world_size=env.world_size,
        remainder=remainder,
        block_size=block_shuffle,
        window=shuffle_window,
        resolution=args.image_size,
    )
    if args.train and len(sampler) == 0:
        raise no_full_batch(path, args.split, len(shards), env.world_size, args.batch_size, FULL_BATCH_FIX)
    geometry = (
        TrainGeometry(image_size=args.image_size) if args.train else EvalGeometry(image_size=args.image_size, crop_fraction=args.crop_ratio)
    )
    shards.labels  # noqa: B018  (bare .rec files: read header labels once here, not in every worker)
    return RankStream(env, shards, sampler, geometry)
