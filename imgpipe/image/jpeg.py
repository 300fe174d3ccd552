"""JPEG headers read without decoding: size, frame type, components, EXIF orientation, markers.

Pack's repair decisions (``packing/codec.py``) and the loaders' size probe read JPEGs through here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

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


def _find(data: bytes | memoryview, sub: bytes, start: int) -> int:
    """``data.find(sub, start)``, for a memoryview too (a record read without a copy)."""
    if isinstance(data, memoryview):
        found = data[start:].tobytes().find(sub)
        return found if found < 0 else start + found
    return data.find(sub, start)


def _segments(data: bytes | memoryview) -> Iterator[tuple[int, int, int]]:
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
            pos = _find(data, b"\xff", pos)
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


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
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
