"""The image geometry both loaders share: train random-resized-crop + flip, eval resize + center crop.

Boxes come from the stored (width, height), read from the JPEG header before decoding, so a loader can
decode at reduced size and resample only the box; all randomness comes from ``seeding.sample_rng``.
Rule: a train box never reads ``image_size``, so the resolution may change between epochs (``at(size)``)
and record i of epoch e keeps its box and flip. The constants are the DALI loader's too: ImageNet's mean
and std in 0-255 units, torchvision's RandomResizedCrop and flip defaults, bilinear with antialiasing,
and ``EVAL_CROP_FRACTION`` (eval resizes the shorter side to ``round(size / 0.875)``, then crops ``size``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from imgpipe.loaders.seeding import SampleStream, sample_rng

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
EVAL_CROP_FRACTION = 0.875
INTERPOLATION = "bilinear"
ANTIALIAS = True
TRAIN_SCALE = (0.08, 1.0)
TRAIN_RATIO = (3 / 4, 4 / 3)
FLIP_P = 0.5
CROP_ATTEMPTS = 10


class Crop(NamedTuple):
    """A box of the stored image (pixels, floats allowed) and whether to mirror the result."""

    left: float
    top: float
    width: float
    height: float
    flip: bool = False

    @property
    def box(self) -> tuple[float, float, float, float]:
        """(left, top, right, bottom), as Pillow's ``resize(box=...)`` takes it."""
        return (self.left, self.top, self.left + self.width, self.top + self.height)


@dataclass(frozen=True)
class TrainGeometry:
    """RandomResizedCrop to ``image_size`` squared, then a horizontal flip with probability ``flip_p``."""

    image_size: int
    scale: tuple[float, float] = TRAIN_SCALE
    ratio: tuple[float, float] = TRAIN_RATIO
    flip_p: float = FLIP_P

    def __init__(
        self, *, image_size: int, scale: tuple[float, float] = TRAIN_SCALE, ratio: tuple[float, float] = TRAIN_RATIO, flip_p: float = FLIP_P
    ) -> None:
        if image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {image_size}")
        if not 0 < scale[0] <= scale[1] or not 0 < ratio[0] <= ratio[1] or not 0 <= flip_p <= 1:
            raise ValueError(f"invalid crop parameters scale={scale} ratio={ratio} flip_p={flip_p}")
        object.__setattr__(self, "image_size", int(image_size))
        object.__setattr__(self, "scale", (float(scale[0]), float(scale[1])))
        object.__setattr__(self, "ratio", (float(ratio[0]), float(ratio[1])))
        object.__setattr__(self, "flip_p", float(flip_p))

    def at(self, size: int) -> TrainGeometry:
        """The same crops, resized to ``size`` squared."""
        return replace(self, image_size=size)

    def sample(self, width: int, height: int, rng: SampleStream) -> Crop:
        """Draw the crop box exactly as torchvision's ``RandomResizedCrop.get_params``, then the flip."""
        left, top, w, h = random_resized_crop_box(width, height, self.scale, self.ratio, rng)
        flip = bool(rng.random() < self.flip_p)
        return Crop(float(left), float(top), float(w), float(h), flip)


@dataclass(frozen=True)
class EvalGeometry:
    """Resize the shorter side to ``round(image_size / crop_fraction)``, then center-crop ``image_size``."""

    image_size: int
    crop_fraction: float = EVAL_CROP_FRACTION

    def __init__(self, *, image_size: int, crop_fraction: float = EVAL_CROP_FRACTION) -> None:
        if image_size < 1 or not 0 < crop_fraction <= 1:
            raise ValueError(f"invalid eval geometry image_size={image_size} crop_fraction={crop_fraction}")
        object.__setattr__(self, "image_size", int(image_size))
        object.__setattr__(self, "crop_fraction", float(crop_fraction))

    def at(self, size: int) -> EvalGeometry:
        """The center crop of ``size`` squared, with the same crop fraction."""
        return replace(self, image_size=size)

    @property
    def resize_shorter(self) -> int:
        """The shorter side after the eval resize (256 for image_size 224)."""
        return int(round(self.image_size / self.crop_fraction))

    def crop(self, width: int, height: int) -> Crop:
        """The center-crop box mapped back into the stored image, as torchvision's Resize + CenterCrop."""
        short, long_ = (width, height) if width <= height else (height, width)
        resized_long = int(self.resize_shorter * long_ / short)
        rw, rh = (self.resize_shorter, resized_long) if width <= height else (resized_long, self.resize_shorter)
        size = self.image_size
        left = int(round((rw - size) / 2.0))
        top = int(round((rh - size) / 2.0))
        sx, sy = width / rw, height / rh
        return Crop(left * sx, top * sy, size * sx, size * sy, False)


def sample_crop(geometry: TrainGeometry | EvalGeometry, width: int, height: int, *, seed: int, epoch: int, index: int) -> Crop:
    """The crop of record ``index`` in ``epoch``: train draws it from ``sample_rng(seed, epoch, index)``
    alone (so both loaders, any rank and any worker draw the same one); eval's is the center crop."""
    if isinstance(geometry, EvalGeometry):
        return geometry.crop(width, height)
    return geometry.sample(width, height, sample_rng(seed, epoch, index))


def random_resized_crop_box(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], rng: SampleStream
) -> tuple[int, int, int, int]:
    """(left, top, w, h) by torchvision's algorithm: ``CROP_ATTEMPTS`` tries, then the center fallback."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(CROP_ATTEMPTS):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h
