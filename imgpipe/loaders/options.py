"""The loaders' options, each declared once with its check: ``LoaderOptions`` (both loaders) and
``TorchLoaderOptions`` (the torch loader's own), frozen and validated once when made.

A mistake is one ``ConfigError`` naming the argument and what it accepts, never a TypeError or a torch
error from deep inside. ``device`` defaults to ``CURRENT_DEVICE`` (the current CUDA device when torch
sees one, else the CPU); ``device=None`` means the CPU.
"""

from __future__ import annotations

import multiprocessing
import numbers
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from imgpipe.errors import ConfigError
from imgpipe.loaders.geometry import EVAL_CROP_FRACTION

if TYPE_CHECKING:
    import torch

ON_CORRUPT = ("raise", "skip")  # what a loader does with a record it cannot decode
REMAINDER_POLICIES = ("drop", "pad")  # what a train pass does with the records that do not fill a global batch
DEFAULT_PREFETCH_FACTOR = 2  # batches prepared ahead: per worker (torch), DALI's queue depth


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


def check_ratio(name: str, value: object) -> float:
    """``value`` as a float in (0, 1]; bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise ConfigError(f"{name} must be a number in (0, 1], such as 224/256 = 0.875, got {value!r}")
    return float(value)


def check_split(name: str, value: object) -> str:
    """A split name, such as 'train'."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a split name such as 'train' or 'val', got {value!r}")
    return value


def check_folder(name: str, value: object) -> str | os.PathLike | None:
    """None, or a local folder as a str or path."""
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name} must be a local folder (a str or path) or None, got {value!r} ({type(value).__name__})")
    return value


def check_transform(name: str, value: object) -> Callable | None:
    """None, or a callable."""
    if value is not None and not callable(value):
        raise ConfigError(f"{name} must be a callable on a uint8 CHW tensor or None, got {value!r}")
    return value


def check_start_method(name: str, value: object) -> str | None:
    """None, or one of this platform's multiprocessing start methods."""
    return None if value is None else check_choice(name, value, multiprocessing.get_all_start_methods())


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


def _option(check: Callable[[str, Any], Any], default: Any = MISSING) -> Any:
    """A field with its check: ``check(name, value)`` returns the value normalized or raises a ConfigError."""
    return field(default=default, metadata={"check": check})


def _int(minimum: int) -> Callable[[str, Any], int]:
    return lambda name, value: check_int(name, value, minimum=minimum)


def _optional_int(minimum: int) -> Callable[[str, Any], int | None]:
    return lambda name, value: check_optional_int(name, value, minimum=minimum)


def _choice(choices: Sequence[str]) -> Callable[[str, Any], str]:
    return lambda name, value: check_choice(name, value, choices)


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """What both loaders take besides the path (docs/api.md), checked and normalized: ints are ints,
    the device is a ``torch.device`` with its index. Made once by a factory and passed down."""

    split: str = _option(check_split, "train")
    batch_size: int = _option(_int(1))
    train: bool = _option(check_bool, True)
    image_size: int = _option(_int(1), 224)
    workers: int | None = _option(_optional_int(0), None)  # None: default_workers() for this rank's node
    seed: int = _option(_int(0), 0)
    rank: int | None = _option(_optional_int(0), None)
    world_size: int | None = _option(_optional_int(1), None)
    device: Any = _option(lambda name, value: resolve_device(value), CURRENT_DEVICE)  # a torch.device once made
    normalize: bool = _option(check_bool, True)
    channels_last: bool = _option(check_bool, False)
    crop_ratio: float = _option(check_ratio, EVAL_CROP_FRACTION)
    remainder: str = _option(_choice(REMAINDER_POLICIES), "drop")
    shuffle: bool | None = _option(check_optional_bool, None)
    block_shuffle: int | None = _option(_optional_int(1), None)
    shuffle_window: int | None = _option(_optional_int(1), None)
    prefetch_factor: int = _option(_int(1), DEFAULT_PREFETCH_FACTOR)
    on_corrupt: str = _option(_choice(ON_CORRUPT), "raise")
    cache_dir: str | os.PathLike | None = _option(check_folder, None)

    def __post_init__(self) -> None:
        for option in fields(self):
            object.__setattr__(self, option.name, option.metadata["check"](option.name, getattr(self, option.name)))
        if self.shuffle_window is not None and self.block_shuffle is None:
            raise ConfigError("shuffle_window only applies with block_shuffle; set block_shuffle too, or leave shuffle_window None")


@dataclass(frozen=True, kw_only=True)
class TorchLoaderOptions(LoaderOptions):
    """``LoaderOptions`` and the torch loader's own. ``persistent_workers``, ``prefetch_factor``, ``pin_memory``
    and ``multiprocessing_context`` go to its DataLoader; imgpipe checks them itself because it sizes the
    ring and picks the copy path from them before the DataLoader exists."""

    max_image_size: int | None = _option(_optional_int(1), None)
    sample_transform: Callable | None = _option(check_transform, None)
    persistent_workers: bool = _option(check_bool, True)
    pin_memory: bool | None = _option(check_optional_bool, None)  # None: on a CUDA device
    multiprocessing_context: str | None = _option(check_start_method, None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pin_memory is None:
            object.__setattr__(self, "pin_memory", self.device.type == "cuda")

    @property
    def ring_size(self) -> int:
        """The largest output size the ring's slots hold from the start."""
        return max(self.image_size, self.max_image_size or 0)
