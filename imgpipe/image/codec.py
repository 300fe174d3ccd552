"""One image in, one JPEG every backend reads the same way out: sniff, keep, repair or skip.

``prepare_image`` keeps a clean JPEG (baseline or progressive, 8-bit YCbCr, no EXIF rotation, ending
with its EOI) byte for byte once it is known that Pillow decodes it whole (``keep_failure``),
re-encodes with Pillow what DALI, MXNet and Pillow would read differently ("repaired"), and skips what
cannot be read, with the reason; the rules are in docs/cli.md. Rule: pack never stores what its own
``verify --decode`` or the loaders reject, and re-encoding is deterministic. ``--resize`` of a clean JPEG
goes through ``imgpipe.image.shrink`` when its extension is built, else through Pillow here.
"""

from __future__ import annotations

import io
import logging
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from imgpipe.image.jpeg import KEEPABLE_SOF, LOSSLESS_SOF, RGB_COMPONENT_IDS, JpegInfo, inspect_jpeg
from imgpipe.image.shrink import draft_size, shrink_jpeg

try:
    from imgpipe.image._jpeg_shrink import scan_problem as _scan_problem
except ImportError:  # no compiler or no libjpeg-turbo headers at install time: Pillow decodes instead
    _scan_problem = None

logger = logging.getLogger(__name__)


def scan_check_built() -> bool:
    """True when kept JPEGs are checked by the C extension's scan walk, not by Pillow's whole decode."""
    return _scan_problem is not None


@dataclass(frozen=True)
class Prepared:
    """The bytes to store (None when skipped), what was done and why."""

    data: bytes | None
    action: str
    reason: str | None = None


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
            failure = keep_failure(trimmed)
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
            failure = None if reasons else keep_failure(data)  # trimmed bytes were checked above
            if failure is not None:  # a clean header over a broken scan: verify --decode and the loaders would fail on it
                return Prepared(None, "skipped", failure)
            return Prepared(data, "repaired" if reasons else "kept", "; ".join(reasons) or None)
        if not repairs:
            size = (info.width, info.height)
            shrunk = shrink_jpeg(data, size, _short_side_size(size, resize), quality)  # type: ignore[arg-type]
            if shrunk is not None:
                return Prepared(shrunk, "resized", "; ".join(reasons) or None)
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


def keep_failure(data: bytes) -> str | None:
    """``decode_failure(data)`` for a JPEG within the pixel limit, mostly without decoding it.

    With the C extension, Pillow parses the headers (``Image.open``: the checks of its own JPEG
    parser) and libjpeg-turbo reads the rest as Pillow's decoder would, without making pixels
    (``scan_problem``; most JPEGs need no Huffman decoding at all). Together they pass only what
    Pillow decodes whole; what they do not pass is decoded by Pillow, whose outcome and reason
    stand, so the outcome and the reason are ``decode_failure``'s, at a fraction of the cost.
    """
    if _scan_problem is not None and _opens(data) and _scan_problem(data) is None:
        return None
    return decode_failure(data)


def _opens(data: bytes) -> bool:
    """Whether Pillow opens ``data`` (headers only; no decode)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Image.open(io.BytesIO(data)).close()
    except MemoryError:
        raise
    except Exception:  # any Pillow failure: decode_failure names it
        return False
    return True


def decode_failure(data: bytes | memoryview) -> str | None:
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


def _failure_reason(data: bytes | memoryview, error: Exception) -> str:
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
    """Let libjpeg decode at 1/2, 1/4 or 1/8 scale when the result stays twice the target size (``draft_size``)."""
    if image.format != "JPEG" or min(image.size) <= short:
        return
    image.draft(None, draft_size(_short_side_size(image.size, short)))


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
