"""The files of a packed folder: their names, and one reader and one writer per sidecar.

The files are listed in docs/format.md. The readers take the sidecar's bytes (so verify can hash the
same bytes it parses) and raise :class:`SidecarError` without the path; each caller turns that into its
own kind of report.
"""

from __future__ import annotations

import hashlib
import io
import re
import warnings
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from imgpipe._sys.atomic import atomic_write_bytes

MANIFEST_NAME = "manifest.json"
SHARD_FILE = re.compile(r"^(?P<split>[^/]+)-\d{5}-of-\d{5}\.(?P<ext>rec|idx|json)$")  # a shard, its index, its journal entry
SOURCES_SUFFIX = ".sources.txt"
LABELS_SUFFIX = ".labels.npy"
CHECKSUMS_SUFFIX = ".crc32.npy"
INDEX_SUFFIX = ".index.npy"
SIDECAR_SUFFIXES = (SOURCES_SUFFIX, LABELS_SUFFIX, CHECKSUMS_SUFFIX, INDEX_SUFFIX)
MAX_SHARDS = 99_999  # a split's shards that shard_stem's five digits number


def shard_stem(split: str, number: int, count: int) -> str:
    """``{split}-{number:05d}-of-{count:05d}``: a shard's name without ``.rec`` / ``.idx``."""
    return f"{split}-{number:05d}-of-{count:05d}"


def is_shard_file(name: str) -> bool:
    """True for a shard's ``.rec`` or ``.idx`` name (not a journal entry)."""
    match = SHARD_FILE.match(name)
    return bool(match) and match["ext"] != "json"


def sources_name(split: str) -> str:
    return split + SOURCES_SUFFIX


def labels_name(split: str) -> str:
    return split + LABELS_SUFFIX


def checksums_name(split: str) -> str:
    return split + CHECKSUMS_SUFFIX


def index_name(split: str) -> str:
    return split + INDEX_SUFFIX


class SidecarError(ValueError):
    """A sidecar that does not hold what the manifest says; ``record`` is set when one record is to blame."""

    def __init__(self, message: str, record: int | None = None) -> None:
        super().__init__(message)
        self.record = record


# ----------------------------------------------------------------------------- writers


def write_sidecar(path: Path, data: bytes) -> str:
    """Write a sidecar atomically; return its sha256 for the manifest."""
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def sources_bytes(paths: Sequence[str]) -> bytes:
    """The sources sidecar: one path per line (paths never hold a newline; the scan rejects them)."""
    return "".join(path + "\n" for path in paths).encode("utf-8", "surrogateescape")


def labels_bytes(labels: np.ndarray) -> bytes:
    return _npy_bytes(np.asarray(labels).astype(np.int32))


def checksums_bytes(crcs: np.ndarray) -> bytes:
    return _npy_bytes(np.asarray(crcs).astype(np.uint32))


def index_bytes(keys: np.ndarray, offsets: np.ndarray) -> bytes:
    """The index sidecar: the split's .idx files in shard order as one (2, records) int64 array, keys
    then offsets, so that a reader opens a split of any number of shards with one read, not one per shard."""
    return _npy_bytes(np.stack([np.asarray(keys, dtype=np.int64), np.asarray(offsets, dtype=np.int64)]))


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


# ----------------------------------------------------------------------------- readers


class SourceLines:
    """The sources sidecar as one blob and the start of each line: no per-line objects."""

    def __init__(self, blob: bytes, starts: np.ndarray) -> None:
        self.blob = blob
        self.starts = starts

    def __len__(self) -> int:
        return int(self.starts.size) - 1

    def raw(self, i: int) -> bytes:
        """Line ``i`` without its newline."""
        end = int(self.starts[i + 1])
        if end > int(self.starts[i]) and self.blob[end - 1 : end] == b"\n":
            end -= 1
        return self.blob[int(self.starts[i]) : end]

    def __iter__(self) -> Iterator[str]:
        """Every line, decoded as the packer encoded it (undecodable bytes kept as surrogates)."""
        for i in range(len(self)):
            yield self.raw(i).decode("utf-8", "surrogateescape")


def parse_sources(blob: bytes, count: int) -> SourceLines:
    """The sources sidecar of ``count`` records (a last line without its newline is accepted)."""
    newlines = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == ord("\n"))
    if blob and not blob.endswith(b"\n"):
        newlines = np.append(newlines, len(blob) - 1)
    if newlines.size != count:
        raise SidecarError(f"{newlines.size} lines, the manifest counts {count} records")
    return SourceLines(blob, np.concatenate([[0], newlines + 1]).astype(np.int64))


def parse_labels(data: bytes, count: int, classes: int) -> np.ndarray:
    """The labels sidecar of ``count`` records as int64, each a class index below ``classes``."""
    labels = _parse_integers(data, count)
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        bad = int(np.argmax((labels < 0) | (labels >= classes)))
        raise SidecarError(f"label {labels[bad]} is outside 0..{classes - 1}", record=bad)
    return labels.astype(np.int64)


def parse_checksums(data: bytes, count: int) -> np.ndarray:
    """The crc32 sidecar of ``count`` records as uint32."""
    crcs = _parse_integers(data, count)
    if crcs.size and (crcs.min() < 0 or crcs.max() > 0xFFFFFFFF):
        raise SidecarError("holds values outside the uint32 range of a crc32")
    return crcs.astype(np.uint32)


def parse_index_sidecar(data: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The index sidecar of ``count`` records as (keys, offsets) int64 arrays (read-only views of ``data``)."""
    array = _npy_view(data, 2)
    if array.shape != (2, count):
        raise SidecarError(f"holds a {array.shape} array, expected (2, {count}): keys and offsets of {count} records")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:  # the int64 cast below would wrap it negative
        row, bad = (int(k) for k in np.unravel_index(np.argmax(array > np.iinfo(np.int64).max), array.shape))
        raise SidecarError(f"record {bad}: {('key', 'offset')[row]} {int(array[row, bad])} is beyond any file (over 2**63 - 1)", record=bad)
    if array[1].size and array[1].min() < 0:
        bad = int(np.argmin(array[1]))
        raise SidecarError(f"record {bad}: negative offset {int(array[1][bad])}", record=bad)
    return array[0].astype(np.int64, copy=False), array[1].astype(np.int64, copy=False)


def _parse_integers(data: bytes, count: int) -> np.ndarray:
    array = _npy_view(data, 1)
    if array.shape[0] != count:
        raise SidecarError(f"holds {array.shape[0]} values, the manifest counts {count} records")
    return array


_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _npy_view(data: bytes, ndim: int) -> np.ndarray:
    """The integer array of a .npy file's bytes, without a copy; its header is checked against the
    bytes that follow it before anything is allocated, so a header cannot ask for more memory."""
    stream = io.BytesIO(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a deprecated dtype in a damaged header is as unreadable as a bad one
            version = np.lib.format.read_magic(stream)
            if version not in _HEADER_READERS:
                raise ValueError(f"format version {version}")
            shape, fortran, dtype = _HEADER_READERS[version](stream)  # numpy's parser: headers over 10,000 bytes refused
    except Exception as e:  # a damaged header reaches numpy's literal_eval: SyntaxError, TokenError, ...
        raise SidecarError(f"not a readable .npy file ({type(e).__name__}: {e})") from None
    if len(shape) != ndim or min(shape, default=0) < 0 or dtype.kind not in "iu" or dtype.hasobject or (fortran and ndim > 1):
        raise SidecarError(f"must be a {ndim}-D integer array, got {dtype} {shape}{' (Fortran order)' if fortran and ndim > 1 else ''}")
    count = int(np.prod(shape, dtype=object))
    body = len(data) - stream.tell()
    if body != count * dtype.itemsize:
        raise SidecarError(f"its header says {shape} {dtype} ({count * dtype.itemsize} bytes) but {body} bytes follow it")
    return np.frombuffer(data, dtype=dtype, count=count, offset=stream.tell()).reshape(shape)
