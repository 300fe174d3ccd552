"""A local file filled by byte ranges: the one place where ``imgpipe stage`` and the node cache write and commit a file.

Ranges arrive in any order, from several threads and processes; each write goes through
``_sys.writes.write_at``, so a write the disk takes only in part is an ``OSError``, never a gap. Once the
caller says a range ``landed``, the file is hashed from the disk in file order as far as its ranges have
landed (unless the caller checks it otherwise: a cache shard's records, by crc32), so the sha256 is that
of what the file holds, not of what was meant to be written. Rule: only
after ``commit`` (fsynced, that sha256 the manifest's, or checked from the disk by the caller) may the
caller say the file is there.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from imgpipe._sys.checksum import hash_range
from imgpipe._sys.writes import write_at


class RangeFile:
    """The file ``path`` of ``size`` bytes, being filled. ``keep``: its bytes stay (a cache shard filled
    again, where present records are kept), else it starts empty. ``writeback``: start writing each
    hashed range to the disk at once (a copy read later, so its pages need not wait in the page cache).
    ``hashing=False``: only which bytes landed is kept (the caller checks the file from the disk itself)."""

    def __init__(self, path: str | os.PathLike, size: int, *, keep: bool = False, writeback: bool = False, hashing: bool = True) -> None:
        self.path = Path(path)
        self.size = size
        self.writeback = writeback and hasattr(os, "posix_fadvise")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | (0 if keep else os.O_TRUNC), 0o644)
        try:
            if os.fstat(self.fd).st_size != size:
                os.ftruncate(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.hashed = 0  # bytes [0, hashed) are hashed
        self.short = False  # the file ended before ``size`` while it was hashed (it changed under us)
        self._digest: Any = hashlib.sha256() if hashing else None
        self._pending: list[tuple[int, int]] = []  # ranges landed and not hashed yet
        self._hashing = False
        self._finished = False
        self._lock = threading.Lock()

    def write(self, at: int, data: Any) -> None:
        """Write all of ``data`` at offset ``at`` (its length checked; a full disk is an ``OSError``)."""
        write_at(self.fd, data, at)

    def landed(self, start: int, end: int) -> bool:
        """Bytes ``[start, end)`` are in the file: hash what can be hashed now, in order. One thread at a
        time hashes (a range that lands meanwhile is hashed by that thread before it returns); True for
        the one call that hashed the file's last byte (``landed(0, 0)`` of an empty file)."""
        with self._lock:
            if end > start:
                self._pending.append((start, end))
            if self._hashing:
                return False
            self._hashing = True
        while True:
            with self._lock:
                self._pending.sort()
                upto = self.hashed
                while self._pending and self._pending[0][0] <= upto:
                    upto = max(upto, self._pending.pop(0)[1])
                if upto == self.hashed or self.short:
                    self._hashing = False
                    finished = self.hashed >= self.size and not self._finished
                    self._finished = self._finished or finished
                    return finished
                start = self.hashed
            try:
                reached = hash_range(self.fd, start, upto, self._digest) if self._digest is not None else upto
            except BaseException:
                with self._lock:
                    self._hashing = False
                raise
            if self.writeback:
                os.posix_fadvise(self.fd, start, upto - start, os.POSIX_FADV_DONTNEED)  # starts the writeback; keeps dirty pages
            with self._lock:
                self.hashed = reached
                self.short = reached < upto

    @property
    def done(self) -> bool:
        """True once every byte has landed (and was hashed)."""
        with self._lock:
            return self._finished

    def sha256(self) -> str:
        """The hex sha256 of the file's bytes as they were hashed (all of them once ``done``); "" when not hashing."""
        return self._digest.hexdigest() if self._digest is not None else ""

    def commit(self, sha256: str | None) -> bool:
        """Fsync the file if all of it landed and it hashes to ``sha256`` (None: its sha256 is unknown, the
        caller checked it otherwise): then, and only then, may the caller say it is there. False if not."""
        if not self.done or self.short or (sha256 is not None and self.sha256() != sha256):
            return False
        os.fsync(self.fd)
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RangeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
