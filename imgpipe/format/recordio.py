"""MXNet RecordIO, byte for byte as dmlc-core frames it: records, IRHeader and the .idx index.

The framing (magic, ``cflag << 29 | len``, payload, padding; a payload split at every aligned magic word)
and the IRHeader ``<IfQQ>`` are drawn in docs/format.md. Rule: readers never trust a length field: every
length is checked against the bytes really there before anything is allocated, and a malformed file
raises RecordIOError naming the file and the offset. They are stricter than dmlc's ``NextRecord``: a
cflag order dmlc never writes is refused.
"""

from __future__ import annotations

import hashlib
import io
import numbers
import os
import re
import struct
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, NamedTuple

import numpy as np

from imgpipe.errors import RecordIOError

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
FRAME_HEADER = struct.Struct("<II")
LENGTH_BITS = 29
LENGTH_MASK = (1 << LENGTH_BITS) - 1
MAX_RECORD_BYTES = 1 << LENGTH_BITS  # dmlc refuses records of 2**29 bytes or more
IR_FORMAT = struct.Struct("<IfQQ")
IR_SIZE = IR_FORMAT.size  # 24

CFLAG_WHOLE, CFLAG_FIRST, CFLAG_MIDDLE, CFLAG_LAST = 0, 1, 2, 3


class IRHeader(NamedTuple):
    """MXNet's image record header. ``label`` is a float, or a float32 array when flag > 0."""

    flag: int
    label: float | np.ndarray
    id: int
    id2: int


def _pad(length: int) -> int:
    return (-length) & 3


# ----------------------------------------------------------------------------- IRHeader


def pack_header(header: IRHeader, payload: bytes) -> bytes:
    """Prefix ``payload`` with ``header`` exactly as ``mxnet.recordio.pack`` does."""
    label = header.label
    if isinstance(label, numbers.Number):  # mxnet's own test: numpy scalars count, 0-d arrays do not
        head = IR_FORMAT.pack(0, float(label), header.id, header.id2)
        return head + payload
    labels = np.asarray(label, dtype=np.float32).ravel()
    head = IR_FORMAT.pack(labels.size, 0.0, header.id, header.id2)
    return head + labels.astype("<f4").tobytes() + payload


LABEL_PROBE_BYTES = FRAME_HEADER.size + IR_SIZE  # a frame header and the IRHeader after it


def peek_scalar_label(head: bytes) -> float | None:
    """The label of the framed record whose first ``LABEL_PROBE_BYTES`` are ``head``, without reading the rest.

    None when that is not enough: a bad magic, a first part shorter than the IRHeader, or a
    label array (``flag`` > 0); the caller then reads the whole record.
    """
    if len(head) < LABEL_PROBE_BYTES:
        return None
    magic, lrec = FRAME_HEADER.unpack_from(head)
    if magic != MAGIC or (lrec & LENGTH_MASK) < IR_SIZE:
        return None
    flag, label, _, _ = IR_FORMAT.unpack_from(head, FRAME_HEADER.size)
    return label if flag == 0 else None


def unpack_header(record: bytes | memoryview, path: object = "<record>", offset: int = 0) -> tuple[IRHeader, bytes | memoryview]:
    """Split a record into its IRHeader and the image bytes, as ``mxnet.recordio.unpack`` does.

    The image bytes are a slice of ``record``: a copy of a ``bytes`` record, a view of a memoryview.
    """
    if len(record) < IR_SIZE:
        raise RecordIOError(path, offset, f"record of {len(record)} bytes is shorter than the {IR_SIZE}-byte IRHeader")
    flag, label, rid, rid2 = IR_FORMAT.unpack_from(record, 0)
    body = IR_SIZE
    if flag > 0:
        need = flag * 4
        if need > len(record) - IR_SIZE:
            raise RecordIOError(path, offset, f"IRHeader label count {flag} needs {need} bytes but the record has {len(record) - IR_SIZE}")
        labels = np.frombuffer(record, dtype="<f4", count=flag, offset=IR_SIZE).astype(np.float32)
        body += need
        return IRHeader(flag, labels, rid, rid2), record[body:]
    return IRHeader(flag, label, rid, rid2), record[body:]


# ----------------------------------------------------------------------------- framing


def frame_parts(record: bytes) -> list[bytes]:
    """Frame one record as dmlc ``RecordIOWriter::WriteRecord`` does, magic splits included: the pieces in order."""
    length = len(record)
    if length >= MAX_RECORD_BYTES:
        raise ValueError(f"RecordIO records must be smaller than 2**29 bytes, got {length}")
    lower_align = length & ~3
    parts: list[bytes] = []
    start = 0
    for pos in _aligned_magic_positions(record, lower_align):
        cflag = CFLAG_FIRST if start == 0 else CFLAG_MIDDLE
        parts.append(FRAME_HEADER.pack(MAGIC, (cflag << LENGTH_BITS) | (pos - start)))
        parts.append(record[start:pos])
        start = pos + 4
    cflag = CFLAG_LAST if start != 0 else CFLAG_WHOLE
    parts.append(FRAME_HEADER.pack(MAGIC, (cflag << LENGTH_BITS) | (length - start)))
    parts.append(record[start:])
    parts.append(b"\0" * _pad(length))
    return parts


def _aligned_magic_positions(record: bytes, lower_align: int) -> list[int]:
    """Offsets where the magic word stands at a 4-byte aligned position, as dmlc scans for it."""
    words = np.frombuffer(record, dtype="<u4", count=lower_align // 4)
    return (np.flatnonzero(words == MAGIC) * 4).tolist()


def _read_frames(read: Callable[[int, int], bytes | memoryview], start: int, end: int, path: object) -> tuple[bytes | memoryview, int]:
    """Decode the record whose first frame is at ``start``; ``read(pos, n)`` returns up to n bytes at pos.

    No length is trusted: a first pass checks every frame header of the record against ``end``
    (reading 8 bytes per frame), and only then is the record read, into one buffer of its size.
    A record of one frame is what ``read`` returned for its body (no copy of a memoryview).
    """
    frames, size, stop = _walk_frames(read, start, end, path)
    if frames == 1:
        return _read_body(read, start, size, path), stop
    out = bytearray(size)
    filled, pos = 0, start
    for _ in range(frames):
        length = FRAME_HEADER.unpack(_read_exact(read, pos, FRAME_HEADER.size, path))[1] & LENGTH_MASK
        if filled + length > size:
            raise RecordIOError(path, pos, "record changed while it was read")
        out[filled : filled + length] = _read_body(read, pos, length, path)
        filled += length
        if filled < size:
            out[filled : filled + 4] = MAGIC_BYTES
            filled += 4
        pos += FRAME_HEADER.size + length + _pad(length)
    return bytes(out), stop


def _walk_frames(read: Callable[[int, int], bytes | memoryview], start: int, end: int, path: object) -> tuple[int, int, int]:
    """Check the frame headers of one record; return (frames, record size, offset just past it)."""
    frames = size = 0
    pos = start
    while True:
        continuation = frames > 0
        if end - pos < FRAME_HEADER.size:
            what = "a continuation frame" if continuation else "a record header"
            raise RecordIOError(path, pos, f"truncated: {max(end - pos, 0)} bytes left where {what} was expected")
        magic, lrec = FRAME_HEADER.unpack(_read_exact(read, pos, FRAME_HEADER.size, path))
        if magic != MAGIC:
            raise RecordIOError(path, pos, f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})")
        cflag, length = lrec >> LENGTH_BITS, lrec & LENGTH_MASK
        if cflag > CFLAG_LAST or (cflag in (CFLAG_MIDDLE, CFLAG_LAST)) != continuation:
            raise RecordIOError(path, pos, f"continue flag {cflag} out of sequence")
        body = pos + FRAME_HEADER.size
        padded = length + _pad(length)
        if padded > end - body:
            raise RecordIOError(path, pos, f"length {length} runs past the end ({end - body} bytes left)")
        frames += 1
        size += length
        pos = body + padded
        if cflag in (CFLAG_WHOLE, CFLAG_LAST):
            return frames, size, pos
        size += len(MAGIC_BYTES)


def _read_body(read: Callable[[int, int], bytes | memoryview], frame_at: int, length: int, path: object) -> bytes | memoryview:
    return _read_exact(read, frame_at + FRAME_HEADER.size, length, path) if length else b""


def _read_exact(read: Callable[[int, int], bytes | memoryview], pos: int, n: int, path: object) -> bytes | memoryview:
    data = read(pos, n)
    if len(data) != n:
        raise RecordIOError(path, pos, f"short read: {len(data)} of {n} bytes (file changed while it was read?)")
    return data


def parse_record(buf: bytes | memoryview, start: int, end: int, path: object, base: int = 0) -> tuple[bytes | memoryview, int]:
    """Decode the record framed in ``buf[start:end]``; return (record, offset just past it).

    A record of one frame (nearly all) is a memoryview of ``buf``, not a copy.

    ``base`` is the file offset of ``buf[0]``: offsets in errors and the result are file offsets.
    """
    view = memoryview(buf).cast("B")
    if not 0 <= start <= end <= len(view):
        raise ValueError(f"bad range [{start}, {end}) for a buffer of {len(view)} bytes")
    record, pos = _read_frames(lambda p, n: view[p - base : p - base + n], base + start, base + end, path)
    return record, pos


def read_record_at(f: BinaryIO | int, offset: int, end: int, path: object) -> tuple[bytes | memoryview, int]:
    """Read the record at ``offset`` of an open file (or fd) whose data ends at ``end``."""
    fd = f if isinstance(f, int) else f.fileno()
    return _read_frames(lambda p, n: os.pread(fd, n, p), offset, end, path)


def slack_problem(buf: bytes | memoryview) -> str | None:
    """Why the bytes of ``buf``, one record that ``parse_record`` read whole, are not all dmlc would write for it:
    a frame's padding that is not zero, or bytes after the record; else None. The record itself is not read."""
    view = memoryview(buf).cast("B")
    pos = 0
    while pos + FRAME_HEADER.size <= len(view):
        lrec = FRAME_HEADER.unpack_from(view, pos)[1]
        body_end = pos + FRAME_HEADER.size + (lrec & LENGTH_MASK)
        pos = body_end + _pad(lrec & LENGTH_MASK)
        if pos > len(view):
            break
        if any(view[body_end:pos]):
            return f"the padding after byte {body_end} of the record is not zero"
        if lrec >> LENGTH_BITS in (CFLAG_WHOLE, CFLAG_LAST):
            return f"{len(view) - pos} bytes after the record" if pos != len(view) else None
    return "not one whole record"


def iter_frames(path: str | os.PathLike) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, record) for every record of a .rec file, scanning from the start."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        offset = 0
        while offset < size:
            record, next_offset = read_record_at(f, offset, size, path)
            yield offset, record
            offset = next_offset


# ----------------------------------------------------------------------------- .idx index


def format_index_line(key: int, offset: int) -> str:
    """One .idx line as MXNet writes it."""
    return f"{key}\t{offset}\n"


_INDEX_BYTES = b"0123456789+- \t\n\r\x0b\x0c"  # digits, signs and what bytes.split() and splitlines() split at


def read_index(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Parse a .idx file into (keys, offsets) int64 arrays, in file order."""
    return parse_index(Path(path).read_bytes(), path)


def parse_index(text: bytes, path: object) -> tuple[np.ndarray, np.ndarray]:
    """(keys, offsets) of a .idx file's bytes: one ``key<TAB>offset`` line per record, as MXNet writes it
    (any blanks between and around the two integers, blank lines skipped). A bad line is a RecordIOError
    naming ``path``, the line and its offset."""
    if text.translate(None, _INDEX_BYTES):
        raise _bad_index_line(text, path)
    if not text.strip():  # loadtxt warns on a file without data
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    try:
        pairs = np.loadtxt(io.StringIO(text.decode("ascii"), newline=None), dtype=np.int64, comments=None, ndmin=2)
    except ValueError:
        pairs = None
    if pairs is None or pairs.shape[1] != 2 or (pairs[:, 1] < 0).any():
        raise _bad_index_line(text, path)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _bad_index_line(text: bytes, path: object) -> RecordIOError:
    """The first line of ``text`` that is not a key and an offset >= 0, both 64-bit integers."""
    offset = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        values = [_int64(field) for field in line.split()]
        if values and (len(values) != 2 or None in values or values[1] < 0):  # type: ignore[operator]
            shown = repr(line.strip()[:40].decode("latin-1")) + ("..." if len(line.strip()) > 40 else "")
            return RecordIOError(path, offset, f"line {number} is not 'key<TAB>offset' (64-bit integers, the offset >= 0): {shown}")
        offset += len(line)
    return RecordIOError(path, 0, "not 'key<TAB>offset' lines")


def _int64(field: bytes) -> int | None:
    """The value of a ``[+-]?[0-9]+`` field in int64's range, or None (a long field is refused before int() reads it)."""
    if not re.fullmatch(rb"[+-]?[0-9]+", field) or len(field.lstrip(b"+-").lstrip(b"0")) > 19:
        return None
    value = int(field)
    return value if -(2**63) <= value < 2**63 else None


# ----------------------------------------------------------------------------- writer


class IndexedRecordWriter:
    """Write a .rec and its .idx exactly as ``mxnet.recordio.MXIndexedRecordIO(..., 'w')`` does.

    ``position`` and ``idx_bytes`` (the sizes so far) and ``rec_sha256`` / ``idx_sha256`` are kept
    as the bytes go out, so a packer never reads its output back to checksum it.
    """

    def __init__(self, rec_path: str | os.PathLike, idx_path: str | os.PathLike) -> None:
        self.rec_path = Path(rec_path)
        self.idx_path = Path(idx_path)
        self._rec = open(self.rec_path, "wb")
        self._idx = open(self.idx_path, "wb")
        self._rec_hash, self._idx_hash = hashlib.sha256(), hashlib.sha256()
        self.position = self.idx_bytes = 0

    def write(self, key: int, record: bytes) -> int:
        """Append one record under ``key``; return its offset."""
        offset = self.position
        for part in frame_parts(record):
            self._rec.write(part)
            self._rec_hash.update(part)
            self.position += len(part)
        self._index(key, offset)
        return offset

    def write_framed(self, key: int, framed: bytes | memoryview) -> int:
        """Append one record already framed (``b"".join(frame_parts(record))``) under ``key``; return its offset."""
        offset = self.position
        self._rec.write(framed)
        self._rec_hash.update(framed)
        self.position += len(framed)
        self._index(key, offset)
        return offset

    def _index(self, key: int, offset: int) -> None:
        line = format_index_line(key, offset).encode("ascii")
        self._idx.write(line)
        self._idx_hash.update(line)
        self.idx_bytes += len(line)

    @property
    def rec_sha256(self) -> str:
        return self._rec_hash.hexdigest()

    @property
    def idx_sha256(self) -> str:
        return self._idx_hash.hexdigest()

    def flush_to_disk(self) -> None:
        """Flush and fsync both files."""
        for f in (self._rec, self._idx):
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        self._rec.close()
        self._idx.close()

    def __enter__(self) -> "IndexedRecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
