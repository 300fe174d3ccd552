"""One record's payload to one ``size`` x ``size`` uint8 CHW tensor along a crop box.

The crop box is computed from the size in the JPEG header, before decoding. Then:

* most JPEGs: torchvision's libjpeg-turbo decoder straight into a tensor (about 1.5x faster
  than Pillow's decode plus its conversion to an array: no RGBX intermediate, no extra copy),
  and torch's uint8 bilinear antialiased resize (vectorized for channels-last 3-channel
  images; about 2.5x faster than Pillow's, same filter). An integral box (the train crop) is
  cut out and resized; a fractional one (the eval center crop) is resampled as torchvision's
  ``Resize`` + ``CenterCrop`` do it: the whole image resized so that the box becomes
  ``size`` x ``size``, then cut;
* a JPEG whose box shrinks ``DRAFT_MIN_REDUCTION`` times or more: Pillow, reduced in the DCT
  domain (``draft``), then Pillow's resize of the box mapped into the reduced image (sub-pixel
  exact, where torch's resize takes whole pixels only); Pillow too for an eval box of an
  extreme aspect ratio, whose whole-image resize would be many times the box;
* anything else, and any JPEG torchvision rejects: Pillow, so a corrupt record fails with
  Pillow's reason, the one ``imgpipe verify`` and pack print.

Memory: the header's size is checked against Pillow's decompression-bomb limit before
any decoder allocates the image.
"""

from __future__ import annotations

import functools
import io
import warnings
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from imgpipe.codec import jpeg_size
from imgpipe.transforms import Crop

DRAFT_MIN_REDUCTION = 2  # decode reduced when the box shrinks by at least this factor
WHOLE_RESIZE_MAX_AREA = 16  # a fractional box resampled by resizing the whole image: at most this many box areas


@functools.cache
def torchvision_jpeg_decoder() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """torchvision's JPEG decoder to RGB, imported on first use (the torch loader asks before it
    forks its workers); None where torchvision's image extension is missing (a source build
    without libjpeg) or, one day, removed."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.io.image import _has_image_ops
    except ImportError:
        return None
    return functools.partial(decode_jpeg, mode=ImageReadMode.RGB) if _has_image_ops() else None


def decode_sample(payload: bytes, crop_for: Callable[[int, int], Crop], size: int) -> torch.Tensor:
    """Decode one image into a ``size`` x ``size`` uint8 CHW tensor along the box ``crop_for(w, h)`` picks."""
    stored, decoder = jpeg_size(payload), torchvision_jpeg_decoder()
    if stored is None or decoder is None:
        return pillow_sample(payload, crop_for, size)
    check_pixel_count(*stored)
    crop = crop_for(*stored)
    pillow_first = reduces_in_dct(crop, size) or whole_resize_too_large(crop, stored)
    pixels = None if pillow_first else torchvision_decode(decoder, payload)
    if pixels is None:  # Pillow's draft or box resize, or a JPEG torchvision rejects: Pillow decodes it or says why not
        return pillow_sample(payload, lambda w, h: crop, size)
    out = resample(pixels, crop.box, size)
    return out.flip(-1) if crop.flip else out


def reduces_in_dct(crop: Crop, size: int) -> bool:
    """Does the box shrink by ``DRAFT_MIN_REDUCTION`` or more, so a JPEG is decoded reduced (Pillow ``draft``)?"""
    return min(crop.width, crop.height) / size >= DRAFT_MIN_REDUCTION


def is_integral(box: tuple[float, float, float, float]) -> bool:
    """Whole pixels only (the train crop), as opposed to the eval crop's fractional box."""
    return all(float(v).is_integer() for v in box)


def whole_resize_too_large(crop: Crop, stored: tuple[int, int]) -> bool:
    """Would resampling this fractional box resize more than ``WHOLE_RESIZE_MAX_AREA`` box areas?

    Eval boxes are about 0.77 of the shorter side squared, so only extreme aspect ratios (over
    about 12:1) get there; Pillow resamples just their box, where a whole-image resize could
    allocate hundreds of MB (a 10000x10 image eval-resized to 256 px high is 256000 px wide).
    """
    return not is_integral(crop.box) and stored[0] * stored[1] > WHOLE_RESIZE_MAX_AREA * crop.width * crop.height


def check_pixel_count(width: int, height: int) -> None:
    """Refuse a header whose pixel count is over Pillow's decompression-bomb limit, before allocating."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > 2 * limit:
        raise Image.DecompressionBombError(
            f"image of {width}x{height} pixels exceeds the limit of {2 * limit} (PIL.Image.MAX_IMAGE_PIXELS x 2); "
            "it may be a decompression bomb"
        )


def torchvision_decode(decoder: Callable[[torch.Tensor], torch.Tensor], payload: bytes) -> torch.Tensor | None:
    """A JPEG as a uint8 CHW tensor (HWC in memory) by torchvision's ``decoder``; None where it fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29 points to TorchCodec; the decoder is unchanged
        try:
            return decoder(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        except RuntimeError:
            return None


def pillow_sample(payload: bytes, crop_for: Callable[[int, int], Crop], size: int) -> torch.Tensor:
    """Any image Pillow reads, along its crop: a JPEG reduced in the DCT domain when the box shrinks
    ``DRAFT_MIN_REDUCTION`` or more, then Pillow's own resize of the (sub-pixel) box."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(payload))
        stored = jpeg_size(payload) or image.size
        crop = crop_for(*stored)
        box = crop.box
        if image.format == "JPEG" and reduces_in_dct(crop, size):
            image.draft("RGB", (max(1, int(stored[0] * size / crop.width)), max(1, int(stored[1] * size / crop.height))))
            sx, sy = image.size[0] / stored[0], image.size[1] / stored[1]
            box = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
        if image.mode != "RGB":
            image = image.convert("RGB")
        out = image.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if crop.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(out)).permute(2, 0, 1)


def resample(pixels: torch.Tensor, box: tuple[float, float, float, float], size: int) -> torch.Tensor:
    """The ``box`` of a uint8 CHW image resized to ``size`` x ``size`` (bilinear, antialiased when shrinking)."""
    left, top, right, bottom = box
    if is_integral(box):
        return resize(pixels[:, int(top) : int(bottom), int(left) : int(right)], size, size)
    sx, sy = size / (right - left), size / (bottom - top)
    height, width = pixels.shape[1:]
    full_w, full_h = max(size, round(width * sx)), max(size, round(height * sy))
    x0, y0 = min(max(0, round(left * sx)), full_w - size), min(max(0, round(top * sy)), full_h - size)
    return resize(pixels, full_h, full_w)[:, y0 : y0 + size, x0 : x0 + size]


def resize(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """A uint8 CHW image resized with torch's bilinear antialiased kernel (channels-last: its vectorized path)."""
    if tuple(pixels.shape[1:]) == (height, width):
        return pixels
    batch = pixels.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    return F.interpolate(batch, size=(height, width), mode="bilinear", antialias=True, align_corners=False)[0]

