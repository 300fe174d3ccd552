"""One record's payload to one ``size`` x ``size`` uint8 CHW tensor along a crop box.

The box comes from the JPEG header's size, checked against Pillow's decompression-bomb limit before
any decoder allocates the image. A JPEG is decoded by imgpipe's region decoder (``_jpeg_region.c``:
only the box, with a whole decode's pixels), else whole by torchvision, reduced in the DCT domain when
the box shrinks ``DRAFT_MIN_REDUCTION`` times or more, and resampled as torchvision's transforms do.
Anything else, and any JPEG the fast decoders reject, goes to Pillow, so a corrupt record fails with
Pillow's reason, the one ``imgpipe verify`` and pack print. Rule: only a decoder's failure on the
record's bytes becomes ``UndecodableImage``; an error of the crop or resize code stays what it is.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import warnings
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

from imgpipe._sys.torch_private import torchvision_has_image_ops
from imgpipe.errors import DatasetError
from imgpipe.image.extensions import INSTALL_FIX, region_decoder_problem
from imgpipe.image.jpeg import jpeg_size
from imgpipe.loaders.geometry import Crop

DRAFT_MIN_REDUCTION = 2  # decode reduced when the box shrinks by at least this factor
WHOLE_RESIZE_MAX_AREA = 16  # a fractional box resampled by resizing the whole image: at most this many box areas


class UndecodableImage(DatasetError):
    """A record's bytes that do not decode to an image; the message is the decoder's reason."""


@contextlib.contextmanager
def decoding() -> Iterator[None]:
    """Around a decoder's work on a record's bytes (and nothing else): its failure becomes ``UndecodableImage``."""
    try:
        yield
    except UnidentifiedImageError as e:
        raise UndecodableImage("not a decodable image") from e
    except MemoryError:
        raise
    except Exception as e:  # Pillow raises many types for bad bytes (NotImplementedError too): any means "cannot decode", as in codec
        raise UndecodableImage(str(e)) from e


def load_decoders() -> None:
    """Import the fast decoders now: the torch loader calls this before it forks its workers, so
    that they share torchvision's image module instead of each importing its own (docs/measurements.md)."""
    if region_decoder() is None:
        torchvision_jpeg_decoder()


@functools.cache
def region_decoder() -> Callable[..., bytearray] | None:
    """``_jpeg_region.decode_region``; None where the extension was not built (no C compiler or
    no libjpeg-turbo headers when imgpipe was installed)."""
    try:
        from imgpipe.image._jpeg_region import decode_region
    except ImportError:
        return None
    return decode_region


def describe_jpeg_decoder() -> str:
    """How the torch loader decodes JPEGs on this install, in words (benchmarks, the demo)."""
    if region_decoder() is not None:
        from imgpipe.image._jpeg_region import LIBJPEG_TURBO_VERSION

        return f"crop regions only, by imgpipe's extension over libjpeg-turbo {LIBJPEG_TURBO_VERSION}"
    return f"whole images, by torchvision (imgpipe's region decoder cannot be imported: {region_decoder_problem()}; {INSTALL_FIX})"


@functools.cache
def torchvision_jpeg_decoder() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """torchvision's JPEG decoder to RGB, imported on first use; None where torchvision's image
    extension is missing (a source build without libjpeg) or, one day, removed."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        return None
    return functools.partial(decode_jpeg, mode=ImageReadMode.RGB) if torchvision_has_image_ops() else None


def decode_sample(payload: bytes | memoryview, crop_for: Callable[[int, int], Crop], size: int) -> torch.Tensor:
    """Decode one image into a ``size`` x ``size`` uint8 CHW tensor along the box ``crop_for(w, h)`` picks;
    ``UndecodableImage`` when the bytes do not decode."""
    stored = jpeg_size(payload)
    if stored is None:
        return pillow_sample(payload, crop_for, size)
    check_pixel_count(*stored)
    crop = crop_for(*stored)
    out = None if whole_resize_too_large(crop, stored) else fast_jpeg_sample(payload, crop, stored, size)
    if out is None:  # Pillow's box resize, or a JPEG the fast decoders reject: Pillow decodes it or says why not
        return pillow_sample(payload, lambda w, h: crop, size)
    return out.flip(-1) if crop.flip else out


def fast_jpeg_sample(payload: bytes | memoryview, crop: Crop, stored: tuple[int, int], size: int) -> torch.Tensor | None:
    """The box, unflipped, by the region decoder where built, else by torchvision's whole decode;
    None where the JPEG is rejected, or where only Pillow's ``draft`` reduces it in the DCT domain."""
    decode = region_decoder()
    if decode is not None:
        return region_sample(decode, payload, crop, stored, size)
    decoder = torchvision_jpeg_decoder()
    if decoder is None or reduces_in_dct(crop, size):
        return None
    pixels = torchvision_decode(decoder, payload)
    return None if pixels is None else resample(pixels, crop.box, size)


def region_sample(
    decode: Callable[..., bytearray], payload: bytes | memoryview, crop: Crop, stored: tuple[int, int], size: int
) -> torch.Tensor | None:
    """The box, unflipped, from the region decoder: just the box (train), the whole image (eval),
    or the box reduced in the DCT domain (a box that shrinks ``DRAFT_MIN_REDUCTION`` or more);
    None where libjpeg rejects the JPEG."""
    if reduces_in_dct(crop, size):
        return reduced_region_sample(decode, payload, crop, stored, size)
    if is_integral(crop.box):
        left, top, width, height = (int(v) for v in crop[:4])
        pixels = region_pixels(decode, payload, left, top, width, height, 1)
        return None if pixels is None else resize(hwc_tensor(pixels, height, width), size, size)
    width, height = stored
    pixels = region_pixels(decode, payload, 0, 0, width, height, 1)
    return None if pixels is None else resample(hwc_tensor(pixels, height, width), crop.box, size)


def region_pixels(
    decode: Callable[..., bytearray], payload: bytes | memoryview, left: int, top: int, width: int, height: int, reduction: int
) -> bytearray | None:
    """The region decoder's RGB rows of a region; None where libjpeg rejects the JPEG (an error or a
    warning: Pillow then decodes it, or says why not)."""
    try:
        return decode(payload, left, top, width, height, reduction)
    except ValueError:
        return None


def reduced_region_sample(
    decode: Callable[..., bytearray], payload: bytes | memoryview, crop: Crop, stored: tuple[int, int], size: int
) -> torch.Tensor | None:
    """The box decoded at the reduction Pillow's ``draft`` picks, with a margin as wide as the resize
    filter reaches, then Pillow's sub-pixel box resize: what ``pillow_sample`` computes, from a region;
    None where libjpeg rejects the JPEG."""
    reduction = draft_reduction(stored, crop, size)
    width, height = (-(-side // reduction) for side in stored)
    sx, sy = width / stored[0], height / stored[1]
    left, top, right, bottom = crop.box[0] * sx, crop.box[1] * sy, crop.box[2] * sx, crop.box[3] * sy
    margin = math.ceil(max(1.0, (right - left) / size, (bottom - top) / size)) + 1
    x0, y0 = max(0, math.floor(left) - margin), max(0, math.floor(top) - margin)
    x1, y1 = min(width, math.ceil(right) + margin), min(height, math.ceil(bottom) + margin)
    pixels = region_pixels(decode, payload, x0, y0, x1 - x0, y1 - y0, reduction)
    if pixels is None:
        return None
    region = Image.frombuffer("RGB", (x1 - x0, y1 - y0), pixels, "raw", "RGB", 0, 1)
    return chw_tensor(region.resize((size, size), Image.Resampling.BILINEAR, box=(left - x0, top - y0, right - x0, bottom - y0)))


def hwc_tensor(buffer: bytearray, height: int, width: int) -> torch.Tensor:
    """RGB bytes, row after row, as a uint8 CHW view (HWC, channels-last, in memory)."""
    return torch.frombuffer(buffer, dtype=torch.uint8).view(height, width, 3).permute(2, 0, 1)


def chw_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB Pillow image as a uint8 CHW tensor (HWC, channels-last, in memory)."""
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def draft_request(stored: tuple[int, int], crop: Crop, size: int) -> tuple[int, int]:
    """The image size to ask Pillow's ``draft`` for, so that the box still covers ``size`` x ``size`` pixels."""
    return max(1, int(stored[0] * size / crop.width)), max(1, int(stored[1] * size / crop.height))


def draft_reduction(stored: tuple[int, int], crop: Crop, size: int) -> int:
    """The DCT-domain reduction Pillow's ``draft`` picks for ``draft_request``: the largest of 8, 4, 2 and 1 it allows."""
    request = draft_request(stored, crop, size)
    allowed = min(stored[0] // request[0], stored[1] // request[1])
    return next(reduction for reduction in (8, 4, 2, 1) if allowed >= reduction)


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
        raise UndecodableImage(
            f"image of {width}x{height} pixels exceeds the limit of {2 * limit} (PIL.Image.MAX_IMAGE_PIXELS x 2); "
            "it may be a decompression bomb"
        )


def torchvision_decode(decoder: Callable[[torch.Tensor], torch.Tensor], payload: bytes | memoryview) -> torch.Tensor | None:
    """A JPEG as a uint8 CHW tensor (HWC in memory) by torchvision's ``decoder``; None where it fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29 points to TorchCodec; the decoder is unchanged
        try:
            return decoder(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        except RuntimeError:
            return None


def pillow_sample(payload: bytes | memoryview, crop_for: Callable[[int, int], Crop], size: int) -> torch.Tensor:
    """Any image Pillow reads, along its crop: a JPEG reduced in the DCT domain when the box shrinks
    ``DRAFT_MIN_REDUCTION`` or more, then Pillow's own resize of the (sub-pixel) box."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with decoding():
            image = Image.open(io.BytesIO(payload))
        stored = jpeg_size(payload) or image.size
        crop = crop_for(*stored)
        box = crop.box
        draft = draft_request(stored, crop, size) if image.format == "JPEG" and reduces_in_dct(crop, size) else None
        with decoding():
            if draft is not None:
                image.draft("RGB", draft)
            image.load()
            if image.mode != "RGB":
                image = image.convert("RGB")
        if draft is not None:
            sx, sy = image.size[0] / stored[0], image.size[1] / stored[1]
            box = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
        out = image.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if crop.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return chw_tensor(out)


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
