"""``pack --resize`` for the common case, a clean YCbCr JPEG, in one call into libjpeg-turbo.

The optional C extension ``imgpipe.image._jpeg_shrink`` decodes in the DCT domain at 1/1, 1/2, 1/4 or
1/8 (the SIMD scales; libjpeg's other M/8 scales are slower than a full decode), keeping at least twice
the target size, resizes with Pillow's antialiased bilinear filter (a 4:2:0 source at full scale as its
Y, Cb and Cr planes) and encodes a baseline JPEG. Pillow's path has the same semantics and output size
but other bytes: an installation without the extension packs other, equally deterministic, bytes.
"""

from __future__ import annotations

from PIL import Image

try:
    from imgpipe.image._jpeg_shrink import shrink as _shrink
except ImportError:  # no compiler or no libjpeg-turbo headers at install time
    _shrink = None

LIBJPEG_TURBO, PILLOW = "libjpeg-turbo", "pillow"  # the names a pack records as options["resizer"]
REDUCTIONS = (8, 4, 2, 1)
REDUCING_GAP = 2  # the decoded image stays at least twice the target: DCT scaling alone aliases fine detail


def available() -> bool:
    """True when the C extension is built, so that ``shrink_jpeg`` can do the work."""
    return _shrink is not None


def resizer() -> str:
    """The resizer ``--resize`` uses in this installation: libjpeg-turbo where the extension is built (Pillow for
    the images it leaves), else Pillow alone. The two give other bytes."""
    return LIBJPEG_TURBO if available() else PILLOW


def draft_size(target: tuple[int, int]) -> tuple[int, int]:
    """The size to ask Pillow's ``draft`` for: ``target`` times ``REDUCING_GAP``, as ``Image.thumbnail`` does."""
    return target[0] * REDUCING_GAP, target[1] * REDUCING_GAP


def dct_reduction(size: tuple[int, int], target: tuple[int, int]) -> int:
    """The reduction (8, 4, 2 or 1) that Pillow's ``draft`` picks for ``draft_size(target)``."""
    request = draft_size(target)
    ratio = min(size[0] // request[0], size[1] // request[1])
    return next(r for r in REDUCTIONS if r <= max(ratio, 1))


def shrink_jpeg(data: bytes, size: tuple[int, int], target: tuple[int, int], quality: int) -> bytes | None:
    """``data`` (a clean 3-component JPEG of ``size``) resized to ``target`` and re-encoded at ``quality``.

    None when the extension is missing, the image is over Pillow's decompression-bomb limit,
    or libjpeg reports any problem: the caller then takes Pillow's path, which decodes what it
    can and names what it cannot.
    """
    limit = Image.MAX_IMAGE_PIXELS
    if _shrink is None or (limit is not None and size[0] * size[1] > limit):
        return None
    try:
        return _shrink(data, 8 // dct_reduction(size, target), target[0], target[1], quality)
    except ValueError:
        return None
