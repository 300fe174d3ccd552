"""One image in, one JPEG every backend reads the same way out: sniff, keep, repair or skip.

``prepare_image`` decides from the JPEG headers whether the bytes can be stored as they
are: a baseline (SOF0/SOF1) or progressive (SOF2), 8-bit, 3-component YCbCr JPEG without
an EXIF rotation that ends with its EOI marker is kept byte-exact, once Pillow has decoded
it whole as ``imgpipe verify --decode`` will, so pack never stores what its own verify or
the loaders reject (re-encoded output is Pillow's own). Anything that DALI, MXNet (OpenCV)
and Pillow would read differently is decoded with Pillow and re-encoded as a baseline RGB
JPEG ("repaired"): CMYK/YCCK, grayscale, RGB-coded or 12-bit or arithmetic-coded JPEGs,
other formats (PNG, GIF, BMP, WebP, ...) whatever their name, and an EXIF orientation other
than 1 (applied, then the EXIF block is dropped: OpenCV and DALI's decoder
(``adjust_orientation=True`` by default) turn the picture, while Pillow and so torchvision
do not).

Truncated beyond repair: a JPEG whose data stops before its EOI marker is skipped without
decoding ("truncated JPEG"); Pillow refuses such a file too unless ``LOAD_TRUNCATED_IMAGES``
is set, and DALI and OpenCV would fill the missing part with grey. Zero padding after the
EOI is allowed and kept; other bytes after the EOI are cut off (lossless, "repaired").
Files Pillow cannot open or decode (empty, not an image, corrupt, or truncated other
formats, with Pillow's default ``LOAD_TRUNCATED_IMAGES = False``) are skipped with the
reason, and so is an image over Pillow's decompression-bomb limit. Re-encoding is
deterministic: the same input always gives the same bytes.
"""

from __future__ import annotations

import io
import logging
import struct
import warnings
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from PIL import Image, ImageOps

logger = logging.getLogger(__name__)

SOI, EOI, SOS, APP1, APP14 = 0xD8, 0xD9, 0xDA, 0xE1, 0xEE
# Start-of-frame markers: every 0xC0-0xCF except DHT (C4), JPG (C8) and DAC (CC).
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
ARITHMETIC_SOF = frozenset({0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
LOSSLESS_SOF = frozenset({0xC3, 0xC7, 0xCB, 0xCF})
KEEPABLE_SOF = frozenset({0xC0, 0xC1, 0xC2})  # baseline, extended sequential, progressive (Huffman)
STANDALONE = frozenset({0x01, *range(0xD0, 0xD8), SOI})  # TEM, RST0-7, SOI: no length field
RGB_COMPONENT_IDS = (0x52, 0x47, 0x42)  # 'R', 'G', 'B': libjpeg then skips the YCbCr transform
ORIENTATION_TAG = 0x0112


@dataclass(frozen=True)
class JpegInfo:
    """What the headers of a JPEG say, read without decoding."""

    width: int
    height: int
    components: int
    precision: int
    sof: int  # the start-of-frame marker byte, e.g. 0xC0 baseline, 0xC2 progressive
    component_ids: tuple[int, ...]
    adobe_transform: int | None  # APP14 "Adobe" colour transform: 0 none (RGB/CMYK), 1 YCbCr, 2 YCCK
    orientation: int | None  # EXIF IFD0 tag 0x0112, None when absent
    ends_with_eoi: bool  # the last non-zero bytes are the EOI marker
    eoi_end: int | None  # offset just past the EOI: the end of data, else the first after the scan starts
    clean: bool  # no stray bytes between marker segments

    @property
    def progressive(self) -> bool:
        return self.sof in PROGRESSIVE_SOF

    @property
    def arithmetic(self) -> bool:
        return self.sof in ARITHMETIC_SOF


@dataclass(frozen=True)
class Prepared:
    """The bytes to store (None when skipped), what was done and why."""

    data: bytes | None
    action: str
    reason: str | None = None


# ----------------------------------------------------------------------------- header parsing


def _segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """Yield (marker, payload start, payload end) up to and including SOS; ``(-1, pos, pos)`` on stray bytes.

    Every step moves forward and every length is checked against the data, so malformed
    input ends the walk instead of looping or reading past the end.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != SOI:
        return
    pos = 2
    while pos < n:
        if data[pos] != 0xFF:
            yield -1, pos, pos
            pos = data.find(b"\xff", pos)
            if pos < 0:
                return
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            return
        marker = data[pos]
        pos += 1
        if marker in STANDALONE or marker == 0x00:
            continue
        if marker == EOI:
            yield marker, pos, pos
            return
        if pos + 2 > n:
            return
        length = (data[pos] << 8) | data[pos + 1]
        end = pos + length
        if length < 2 or end > n:
            return
        yield marker, pos + 2, end
        if marker == SOS:
            return
        pos = end


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the first SOFn header, as stored (EXIF orientation not applied); no decode.

    None when ``data`` is not a JPEG, has no complete SOF before its scan, or a zero side.
    """
    for marker, start, end in _segments(data):
        if marker in SOF_MARKERS:
            if end - start < 6:
                return None
            height, width = struct.unpack_from(">HH", data, start + 1)
            return (width, height) if width and height else None
        if marker == SOS:
            return None
    return None


def inspect_jpeg(data: bytes) -> JpegInfo | None:
    """Parse the JPEG headers (SOF, APP1 Exif, APP14 Adobe, EOI) without decoding; None if not a JPEG with a SOF."""
    sof = None
    adobe = None
    orientation = None
    clean = True
    scan_start = None
    for marker, start, end in _segments(data):
        if marker == -1:
            clean = False
        elif marker in SOF_MARKERS and sof is None:
            if end - start < 6:
                return None
            precision = data[start]
            height, width = struct.unpack_from(">HH", data, start + 1)
            ncomp = data[start + 5]
            ids = tuple(data[start + 6 + 3 * i] for i in range(ncomp) if start + 6 + 3 * i < end)
            sof = (marker, precision, width, height, ncomp, ids)
        elif marker == APP14 and end - start >= 12 and data[start : start + 5] == b"Adobe":
            adobe = data[start + 11]
        elif marker == APP1 and orientation is None:
            orientation = _exif_orientation(data[start:end])
        elif marker == SOS:
            scan_start = end
        elif marker == EOI:
            break
    if sof is None:
        return None
    marker, precision, width, height, ncomp, ids = sof
    if not (width and height):
        return None
    ends_with_eoi = data.endswith(b"\xff\xd9") or data.rstrip(b"\x00").endswith(b"\xff\xd9")
    eoi_end = len(data) if data.endswith(b"\xff\xd9") else None
    if eoi_end is None and scan_start is not None:
        found = data.find(b"\xff\xd9", scan_start)
        eoi_end = None if found < 0 else found + 2
    return JpegInfo(
        width=width,
        height=height,
        components=ncomp,
        precision=precision,
        sof=marker,
        component_ids=ids,
        adobe_transform=adobe,
        orientation=orientation,
        ends_with_eoi=ends_with_eoi,
        eoi_end=eoi_end,
        clean=clean,
    )


def _exif_orientation(segment: bytes) -> int | None:
    """The Orientation tag of IFD0 in an APP1 Exif payload; None if absent or malformed."""
    if not segment.startswith(b"Exif\0\0"):
        return None
    tiff = segment[6:]
    if tiff[:4] == b"II*\0":
        order = "<"
    elif tiff[:4] == b"MM\0*":
        order = ">"
    else:
        return None
    if len(tiff) < 8:
        return None
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    count = min(count, (len(tiff) - ifd - 2) // 12)
    for i in range(count):
        entry = ifd + 2 + 12 * i
        tag, kind, _ = struct.unpack_from(order + "HHI", tiff, entry)
        if tag != ORIENTATION_TAG:
            continue
        if kind == 3:  # SHORT
            return struct.unpack_from(order + "H", tiff, entry + 8)[0]
        if kind == 4:  # LONG
            return struct.unpack_from(order + "I", tiff, entry + 8)[0]
        return None
    return None


def _repair_reasons(info: JpegInfo) -> list[str]:
    """Why this JPEG cannot be stored as is; empty when every backend reads it alike."""
    reasons = []
    if info.sof in LOSSLESS_SOF:
        reasons.append("lossless JPEG")
    elif info.arithmetic:
        reasons.append("arithmetic-coded JPEG")
    elif info.sof not in KEEPABLE_SOF:
        reasons.append(f"JPEG with SOF marker 0x{info.sof:02X}")
    if info.precision != 8:
        reasons.append(f"{info.precision}-bit JPEG")
    if info.components == 4:
        kind = "YCCK" if info.adobe_transform == 2 else "CMYK"
        reasons.append(f"{kind} JPEG converted to RGB")
    elif info.components == 1:
        reasons.append("grayscale JPEG converted to RGB")
    elif info.components != 3:
        reasons.append(f"{info.components}-component JPEG converted to RGB")
    elif info.adobe_transform == 0 or (info.adobe_transform is None and info.component_ids == RGB_COMPONENT_IDS):
        reasons.append("RGB-coded JPEG converted to YCbCr")
    if info.orientation is not None and info.orientation != 1:
        valid = 1 <= info.orientation <= 8
        reasons.append(f"EXIF orientation {info.orientation} {'applied' if valid else '(invalid) removed'}")
    if not info.clean:
        reasons.append("stray bytes between JPEG segments")
    return reasons


# ----------------------------------------------------------------------------- prepare


def prepare_image(data: bytes, *, resize: int | None = None, quality: int = 95) -> Prepared:
    """Keep, repair, resize or skip one source file; never raises for a bad image.

    ``resize`` is the target shorter side; images whose shorter side is already at most
    ``resize`` are never upscaled. ``quality`` is the JPEG quality of any re-encode.
    """
    if not data:
        return Prepared(None, "skipped", "empty file")
    info = inspect_jpeg(data)
    reasons: list[str] = []
    if info is not None:
        too_large = _too_large(info.width, info.height)
        if too_large:  # kept or resized alike: what pack stores must decode in verify --decode and the loaders
            return Prepared(None, "skipped", too_large)
        if not info.ends_with_eoi:
            if info.eoi_end is None:
                return Prepared(None, "skipped", "truncated JPEG (no EOI marker)")
            # Bytes after the EOI: cut them off (lossless) if what remains decodes.
            trimmed = data[: info.eoi_end]
            failure = decode_failure(trimmed)
            if failure is not None:
                return Prepared(None, "skipped", failure)
            cut = len(data) - len(trimmed)
            data = trimmed
            info = inspect_jpeg(data)
            if info is None:  # pragma: no cover - the header was parsed just above
                return Prepared(None, "skipped", "not a JPEG after trimming")
            reasons.append(f"{cut} bytes after the EOI marker removed")
        repairs = _repair_reasons(info)
        needs_resize = resize is not None and min(info.width, info.height) > resize
        if not repairs and not needs_resize:
            failure = None if reasons else decode_failure(data)  # trimmed bytes were decoded above
            if failure is not None:  # a clean header over a broken scan: verify --decode and the loaders would fail on it
                return Prepared(None, "skipped", failure)
            return Prepared(data, "repaired" if reasons else "kept", "; ".join(reasons) or None)
        if not repairs:
            return _reencode(data, resize, quality, action="resized", reasons=reasons)
        reasons.extend(repairs)
    return _reencode(data, resize, quality, action="repaired", reasons=reasons)


def _reencode(data: bytes, resize: int | None, quality: int, *, action: str, reasons: list[str]) -> Prepared:
    """Decode with Pillow, apply EXIF orientation, convert to RGB, shrink if asked, encode a baseline JPEG."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as image:
                fmt = image.format or "unknown"
                full_size = image.size
                if resize is not None:
                    _draft_for(image, resize)
                image.load()
                if fmt != "JPEG" and action == "repaired":
                    reasons.append(f"{fmt} image re-encoded as JPEG")
                decoded_size = image.size
                rgb = _to_rgb(ImageOps.exif_transpose(image))
    except Image.DecompressionBombError as e:
        return Prepared(None, "skipped", f"image too large to decode safely ({e})")
    except MemoryError:
        raise
    except Exception as e:  # Pillow raises many types for bad input; any of them means "cannot decode"
        return Prepared(None, "skipped", _failure_reason(data, e))
    if resize is not None and min(full_size) > resize:
        upright = full_size[::-1] if rgb.size != decoded_size else full_size  # EXIF may have turned it
        # Antialiased bilinear: the loaders' interpolation, and ~30 % cheaper than bicubic here.
        rgb = rgb.resize(_short_side_size(upright, resize), Image.Resampling.BILINEAR, reducing_gap=3.0)
        if action == "repaired":
            reasons.append(f"resized to shorter side {resize}")
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=quality, optimize=False, progressive=False)
    return Prepared(out.getvalue(), action, "; ".join(reasons) or None)


def _too_large(width: int, height: int) -> str | None:
    """The skip reason when Pillow would refuse to decode a ``width`` x ``height`` image.

    Pillow raises DecompressionBombError above twice ``Image.MAX_IMAGE_PIXELS``; verify
    --decode decodes with the same limit (and the loaders reject such images too), so pack
    never stores one.
    """
    limit = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else None
    if limit is None or width * height <= limit:
        return None
    return f"image too large to decode safely ({width}x{height} = {width * height:,} pixels, over Pillow's limit of {limit:,})"


def decode_failure(data: bytes) -> str | None:
    """None when Pillow decodes ``data`` completely, else the skip reason."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as image:
                image.load()
    except MemoryError:
        raise
    except Exception as e:  # any Pillow failure means the image cannot be decoded
        return _failure_reason(data, e)
    return None


def _failure_reason(data: bytes, error: Exception) -> str:
    if isinstance(error, Image.UnidentifiedImageError):
        return "not an image"
    message = str(error)
    if "truncated" in message:
        return "truncated JPEG" if data[:2] == b"\xff\xd8" else f"truncated image ({message})"
    return f"cannot decode ({type(error).__name__}: {message})"


def _short_side_size(size: tuple[int, int], short: int) -> tuple[int, int]:
    """(width, height) with the shorter side ``short`` and the aspect ratio kept."""
    width, height = size
    if width <= height:
        return short, max(1, round(height * short / width))
    return max(1, round(width * short / height)), short


def _draft_for(image: Image.Image, short: int) -> None:
    """Let libjpeg decode at 1/2, 1/4 or 1/8 scale when the result still covers the target size."""
    if image.format != "JPEG" or min(image.size) <= short:
        return
    target = _short_side_size(image.size, short)
    image.draft(None, target)


def _to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB (alpha dropped, as torchvision's ImageFolder does)."""
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I") or image.mode == "F":  # 16/32-bit or float gray: scale to 8 bits
        values = np.asarray(image, dtype=np.float64)
        if image.mode.startswith("I;16") or values.max(initial=0) > 255:
            values = values / 257
        image = Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))
    if image.mode == "P":
        image = image.convert("RGBA")
    return image.convert("RGB")
