"""``data.resolution``: the training image size of each epoch (progressive resizing).

Two forms, checked into a :class:`ResolutionSchedule`: a ramp ``{start_px, end_px, start_ramp, end_ramp}``
(epochs), as FFCV's ``get_resolution`` (``start_px`` up to epoch ``start_ramp``, ``end_px`` from epoch
``end_ramp`` on, in between the linear interpolation rounded to a multiple of 32 px), or a list of sizes,
one per epoch (the epochs after the list keep its last size). Absent (None), every epoch trains at
``data.image_size``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from imgpipe.errors import ConfigError

RAMP_KEYS = ("start_px", "end_px", "start_ramp", "end_ramp")
ROUND_PX = 32  # FFCV rounds the sizes inside the ramp to a multiple of 32 px
FORMS = "a mapping {start_px, end_px, start_ramp, end_ramp} (epochs) or a list of sizes, one per epoch"


@dataclass(frozen=True)
class ResolutionSchedule:
    """The training size of every epoch: ``sizes`` per epoch (the last one holds after them), or a ramp."""

    sizes: tuple[int, ...] = ()
    start_px: int = 0
    end_px: int = 0
    start_ramp: int = 0
    end_ramp: int = 0

    def at(self, epoch: int) -> int:
        """The training size of ``epoch``."""
        if self.sizes:
            return self.sizes[min(epoch, len(self.sizes) - 1)]
        if epoch <= self.start_ramp:
            return self.start_px
        if epoch >= self.end_ramp:
            return self.end_px
        progress = (epoch - self.start_ramp) / (self.end_ramp - self.start_ramp)
        return int(round((self.start_px + progress * (self.end_px - self.start_px)) / ROUND_PX)) * ROUND_PX

    def distinct(self, epochs: int) -> list[int]:
        """The sizes epochs 0 .. ``epochs`` - 1 train at, in order of first use."""
        return list(dict.fromkeys(self.at(e) for e in range(epochs)))


def parse_resolution(value: Any, image_size: int) -> ResolutionSchedule:
    """``data.resolution`` as a schedule (None: ``image_size`` throughout); a ConfigError (without the
    key's origin, which the caller adds) says what is wrong."""
    if value is None:
        return ResolutionSchedule(sizes=(image_size,))
    if isinstance(value, list):
        if not value or not all(_is_size(v) for v in value):
            raise ConfigError(f"data.resolution as a list must hold sizes in pixels (integers > 0), one per epoch, got {value!r}")
        return ResolutionSchedule(sizes=tuple(value))
    if not isinstance(value, dict):
        raise ConfigError(f"data.resolution must be {FORMS}, got {value!r}")
    for key in value:
        if key not in RAMP_KEYS:
            close = difflib.get_close_matches(str(key), RAMP_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(RAMP_KEYS)}"
            raise ConfigError(f"data.resolution has no key {key!r}{hint}")
    missing = [key for key in RAMP_KEYS if key not in value]
    if missing:
        raise ConfigError(f"data.resolution needs {', '.join(missing)} too (it takes {', '.join(RAMP_KEYS)})")
    for key in ("start_px", "end_px"):
        if not _is_size(value[key]):
            raise ConfigError(f"data.resolution.{key} must be a size in pixels (an integer > 0), got {value[key]!r}")
    for key in ("start_ramp", "end_ramp"):
        if isinstance(value[key], bool) or not isinstance(value[key], int) or value[key] < 0:
            raise ConfigError(f"data.resolution.{key} must be an epoch (an integer >= 0), got {value[key]!r}")
    if value["start_px"] > value["end_px"]:
        raise ConfigError(f"data.resolution ramps up: start_px {value['start_px']} must not exceed end_px {value['end_px']}")
    if value["start_ramp"] > value["end_ramp"]:
        raise ConfigError(f"data.resolution.start_ramp {value['start_ramp']} must not come after end_ramp {value['end_ramp']}")
    return ResolutionSchedule(**{key: int(value[key]) for key in RAMP_KEYS})


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def val_image_size(config: Any) -> int:
    """The validation size (a TrainConfig's): data.val_image_size, else data.image_size."""
    return config.data.val_image_size or config.data.image_size
