"""Test-only RecordIO helpers built on the real reader and framer (the package itself needs neither)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from imgpipe.errors import RecordIOError
from imgpipe.format import recordio
from imgpipe.format.recordio import IRHeader


def frame(record: bytes) -> bytes:
    """One framed record, as ``IndexedRecordWriter`` writes it."""
    return b"".join(recordio.frame_parts(record))


def read_indexed(rec_path: str | os.PathLike, idx_path: str | os.PathLike) -> Iterator[tuple[int, IRHeader, bytes]]:
    """Yield (key, header, image bytes) for each .idx entry of a .rec, in index order."""
    keys, offsets = recordio.read_index(idx_path)
    size = Path(rec_path).stat().st_size
    with open(rec_path, "rb") as f:
        for key, offset in zip(keys.tolist(), offsets.tolist()):
            if offset >= size:
                raise RecordIOError(idx_path, offset, f"index offset {offset} is past the end of {rec_path} ({size} bytes)")
            record, _ = recordio.read_record_at(f, offset, size, rec_path)
            header, payload = recordio.unpack_header(record, rec_path, offset)
            yield key, header, payload
