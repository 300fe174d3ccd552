"""JPEGs for the keep path's scan check: a zoo of encodings and damage, and seeded random corruptions of scans.

Everything is made from ``imgpipe.synth.tree``'s pictures with Pillow, deterministically, except the
two arithmetic-coded files in ``data/`` (Pillow cannot write them; made once with libjpeg-turbo
2.1.5's ``jpegtran -arithmetic [-progressive]`` from a 64x48 baseline JPEG).
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
from PIL import Image

from imgpipe.image.jpeg import SOF_MARKERS, SOS
from imgpipe.synth.tree import class_image

DATA = Path(__file__).parent / "data"
SCAN_CORRUPTIONS = 200


def picture(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(class_image(rng, seed % 10, 10, width, height))


def encode(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def encodings() -> dict[str, bytes]:
    """Valid JPEGs of every kind pack meets: the ones it keeps and the ones it repairs."""
    photo = picture(320, 240, 1)
    zoo = {
        "baseline 4:2:0 q95": encode(photo, quality=95),
        "baseline 4:2:2": encode(photo, quality=90, subsampling=1),
        "baseline 4:4:4": encode(photo, quality=90, subsampling=0),
        "optimized Huffman tables": encode(photo, quality=85, optimize=True),
        "progressive": encode(photo, quality=90, progressive=True),
        "progressive 4:4:4": encode(photo, quality=90, progressive=True, subsampling=0),
        "restart markers every 3 MCUs": encode(photo, quality=90, restart_marker_blocks=3),
        "restart markers every MCU row, progressive": encode(photo, quality=90, restart_marker_rows=1, progressive=True),
        "odd size 97x61": encode(picture(97, 61, 2), quality=90),
        "1x1": encode(picture(8, 8, 3).resize((1, 1)), quality=90),
        "exif orientation 1": encode(photo, quality=90, exif=_exif_orientation(1)),
        "grayscale": encode(photo.convert("L"), quality=90),
        "grayscale progressive": encode(photo.convert("L"), quality=90, progressive=True),
        "cmyk": encode(photo.convert("CMYK"), quality=90),
        "arithmetic": (DATA / "arithmetic.jpg").read_bytes(),
        "arithmetic progressive": (DATA / "arithmetic_progressive.jpg").read_bytes(),
    }
    zoo["12-bit header"] = _patch_sof(zoo["baseline 4:2:2"], precision=12)
    return zoo


def damaged() -> dict[str, bytes]:
    """Valid headers over bad data, bad headers over good data, truncations, stray bytes, huge sizes."""
    good = encode(picture(160, 120, 4), quality=92)
    progressive = encode(picture(160, 120, 5), quality=92, progressive=True)
    restarts = encode(picture(160, 120, 6), quality=92, restart_marker_blocks=2)
    scan = _scan_start(good)
    zoo: dict[str, bytes] = {}
    for name, data in (("baseline", good), ("progressive", progressive), ("restart markers", restarts)):
        start = _scan_start(data)
        for fraction in (0.0, 0.01, 0.3, 0.7, 0.99):
            cut = start + int(fraction * (len(data) - 2 - start))
            zoo[f"{name} cut at {fraction:.0%} of the scan"] = data[:cut]
            zoo[f"{name} cut at {fraction:.0%} of the scan, then EOI"] = data[:cut] + b"\xff\xd9"
        zoo[f"{name} without EOI"] = data[:-2]
        zoo[f"{name} EOI twice"] = data + b"\xff\xd9"
        zoo[f"{name} garbage after EOI"] = data + b"garbage"
        zoo[f"{name} 240 extraneous bytes before EOI"] = data[:-2] + bytes(range(1, 241)) + b"\xff\xd9"
    for cut in (2, 20, 100, scan - 1):
        zoo[f"cut in the headers at byte {cut}"] = good[:cut]
        zoo[f"cut in the headers at byte {cut}, then EOI"] = good[:cut] + b"\xff\xd9"
    zoo["stray bytes before the first marker"] = good[:2] + b"\x00\x01" + good[2:]
    zoo["stray bytes between segments"] = _insert_before_marker(good, 0xDB, b"junk")
    zoo["stray bytes before SOS"] = _insert_before_marker(good, SOS, b"\x00\x00\x00")
    zoo["fill bytes before SOS"] = _insert_before_marker(good, SOS, b"\xff\xff\xff")
    zoo["second SOI in the scan"] = _insert_in_scan(good, 0.5, b"\xff\xd8")
    zoo["unknown marker 0xFF02 in the scan"] = _insert_in_scan(good, 0.5, b"\xff\x02")
    zoo["SOF marker in the scan"] = _insert_in_scan(good, 0.5, b"\xff\xc0\x00\x11")
    zoo["SOS marker in the scan"] = _insert_in_scan(good, 0.5, b"\xff\xda\x00\x0c\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00")
    zoo["DHT marker in the scan"] = _insert_in_scan(good, 0.5, b"\xff\xc4\x00\x05\x10\xff")
    zoo["APP marker running past the end in the scan"] = _insert_in_scan(good, 0.98, b"\xff\xe3\x7f\xff")
    zoo["COM marker in the scan"] = _insert_in_scan(good, 0.5, b"\xff\xfe\x00\x04ok")
    zoo["restart marker where none is expected"] = _insert_in_scan(good, 0.5, b"\xff\xd3")
    zoo["restart markers out of order"] = restarts.replace(b"\xff\xd2", b"\xff\xd5", 1)
    zoo["a restart marker missing"] = restarts.replace(b"\xff\xd1", b"", 1)
    zoo["EOI in the middle of the scan"] = _insert_in_scan(good, 0.5, b"\xff\xd9")
    zoo["short DQT table"] = _shorten_segment(good, 0xDB, 10)
    zoo["short Adobe APP14"] = _add_segment(good, 0xEE, b"Adobe")
    zoo["short ICC profile APP2"] = _add_segment(good, 0xE2, b"ICC_PROFILE\x00")
    zoo["short JFIF APP0"] = _add_segment(good[:2] + good[2 + 2 + struct.unpack(">H", good[4:6])[0] :], 0xE0, b"JFIF\x00")
    zoo["huffman table missing"] = _drop_segments(good, 0xC4)
    zoo["quantization table missing"] = _drop_segments(good, 0xDB)
    zoo["SOF missing"] = _drop_segments(good, 0xC0)
    zoo["3 components, sampling 3x1 and 2x1 (fractional)"] = _patch_sampling(good, [0x31, 0x21, 0x21])
    zoo["sampling factor 0"] = _patch_sampling(good, [0x22, 0x00, 0x11])
    zoo["huge: 20000x20000 header over a small scan"] = _patch_sof(good, width=20000, height=20000)
    zoo["zero height (DNL)"] = _patch_sof(good, height=0)
    zoo["empty"] = b""
    zoo["SOI only"] = b"\xff\xd8"
    zoo["SOI and EOI"] = b"\xff\xd8\xff\xd9"
    zoo["not an image"] = b"hello, world" * 10
    return zoo


def scan_corruptions(sources: dict[str, bytes], count: int = SCAN_CORRUPTIONS, seed: int = 0) -> dict[str, bytes]:
    """``count`` copies of ``sources`` damaged inside their entropy-coded data (from the end of the first
    SOS header to just before the final EOI), seeded: random bytes overwritten, a burst of random bytes,
    bytes dropped, a random marker inserted, or a cut (with the EOI put back, as a clean header
    and EOI over a broken scan)."""
    rng = np.random.default_rng(seed)
    names = sorted(sources)
    out: dict[str, bytes] = {}
    for k in range(count):
        name = names[k % len(names)]
        data = bytearray(sources[name])
        start, end = _scan_start(data), len(data) - 2
        pos = int(rng.integers(start, end))
        kind = ("bytes", "burst", "drop", "marker", "cut")[int(rng.integers(5))]
        if kind == "bytes":
            for p in rng.integers(start, end, size=int(rng.integers(1, 5))):
                data[int(p)] = int(rng.integers(256))
        elif kind == "burst":
            run = int(rng.integers(8, 65))
            data[pos : pos + run] = rng.integers(0, 256, size=min(run, end - pos), dtype=np.uint8).tobytes()
        elif kind == "drop":
            del data[pos : pos + int(rng.integers(1, 33))]
        elif kind == "marker":
            data[pos:pos] = bytes([0xFF, int(rng.integers(1, 256))])
        else:
            data = data[:pos] + b"\xff\xd9"
        out[f"{name}: {kind} at {pos} (#{k})"] = bytes(data)
    return out


def scan_corruption_sources() -> dict[str, bytes]:
    """The JPEGs pack keeps whose scans ``scan_corruptions`` damages: ImageNet-like sizes and encodings."""
    return {
        "500x375 q95 4:2:0": encode(picture(500, 375, 11), quality=95),
        "375x500 q90 progressive": encode(picture(375, 500, 12), quality=90, progressive=True),
        "500x333 q90 4:4:4": encode(picture(500, 333, 13), quality=90, subsampling=0),
        "400x300 q90 restart markers": encode(picture(400, 300, 14), quality=90, restart_marker_blocks=4),
        "333x500 q85 optimized": encode(picture(333, 500, 15), quality=85, optimize=True),
    }


# ----------------------------------------------------------------------------- byte surgery


def _segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker, offset of its 0xFF, offset past the segment) from SOI up to and including the first SOS."""
    out, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        end = pos + 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        out.append((marker, pos, end))
        if marker == SOS:
            break
        pos = end
    return out


def _scan_start(data: bytes | bytearray) -> int:
    return next(end for marker, _, end in _segments(bytes(data)) if marker == SOS)


def _insert_before_marker(data: bytes, marker: int, junk: bytes) -> bytes:
    at = next(start for m, start, _ in _segments(data) if m == marker)
    return data[:at] + junk + data[at:]


def _insert_in_scan(data: bytes, fraction: float, inserted: bytes) -> bytes:
    start = _scan_start(data)
    at = start + int(fraction * (len(data) - 2 - start))
    while data[at - 1] == 0xFF:  # not between an 0xFF and its stuffed zero
        at += 1
    return data[:at] + inserted + data[at:]


def _shorten_segment(data: bytes, marker: int, by: int) -> bytes:
    _, start, end = next(s for s in _segments(data) if s[0] == marker)
    length = end - start - 2 - by
    return data[: start + 2] + struct.pack(">H", length) + data[start + 4 : end - by] + data[end:]


def _add_segment(data: bytes, marker: int, payload: bytes) -> bytes:
    return data[:2] + bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload + data[2:]


def _drop_segments(data: bytes, marker: int) -> bytes:
    kept, last = [data[:2]], 2
    for m, start, end in _segments(data):
        kept.append(data[last:start])
        if m != marker:
            kept.append(data[start:end])
        last = end
    return b"".join(kept) + data[last:]


def _sof(data: bytes) -> tuple[int, int]:
    return next((start, end) for m, start, end in _segments(data) if m in SOF_MARKERS)


def _patch_sof(data: bytes, *, precision: int | None = None, width: int | None = None, height: int | None = None) -> bytes:
    start, _ = _sof(data)
    out = bytearray(data)
    p, h, w = struct.unpack(">BHH", out[start + 4 : start + 9])
    out[start + 4 : start + 9] = struct.pack(">BHH", precision if precision is not None else p, height if height is not None else h,
                                             width if width is not None else w)  # fmt: skip
    return bytes(out)


def _patch_sampling(data: bytes, factors: list[int]) -> bytes:
    start, _ = _sof(data)
    out = bytearray(data)
    for i, factor in enumerate(factors):
        out[start + 10 + 3 * i + 1] = factor
    return bytes(out)


def _exif_orientation(value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()
