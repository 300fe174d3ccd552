"""A ``ByteSource`` that reads a split's records from its node-local cache folder, and from the URL what is missing.

A record is read from the folder when its shard is complete, or when its presence byte is set and its
bytes pass the ShardSet's check. Missing records are waited for while the background fill is due to end
within ``WAIT_S`` (a process with its own obstore client fills their shards itself meanwhile:
``shardfill``), then fetched from the URL in one batch, checked, and written whole at their offsets.
Writes from several processes meet only at identical bytes; which records are read stays the caller's.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from imgpipe._sys.forks import reset_after_fork
from imgpipe._sys.threads import DaemonPool
from imgpipe._sys.writes import write_at
from imgpipe.cache.nodecache import NodeCache, warn_unwritable
from imgpipe.cache.shardfill import SplitFill
from imgpipe.errors import ImgpipeError
from imgpipe.storage.source import ByteRange, ByteSource, RangeCheck

WAIT_S = 2.0  # a record missing while the background fill is due to end within this long is waited for, not fetched alone
LATE_S = 0.5  # and while it is late by less than this
POLL_S = 0.01


class CacheSource(ByteSource):
    """The records of one split through ``cache``, fetched from ``upstream`` when missing.

    ``offsets`` and ``ends``: every record's byte range in its shard, in record order; ``crcs``:
    every record's crc32 (None for a pack without them: then only complete shards are read from
    the folder, and single records are not cached).
    """

    remote = True

    def __init__(
        self, upstream: ByteSource, cache: NodeCache, split: str, offsets: np.ndarray, ends: np.ndarray, crcs: np.ndarray | None
    ) -> None:
        self.upstream = upstream
        self.location = upstream.location
        self.folder = cache.folder
        self.trust_partial = crcs is not None
        self.shards = SplitFill(cache, split, offsets, ends, crcs)
        self._numbers = {name: s for s, name in enumerate(self.shards.rec_names)}
        self._helping = True  # this process fills shards it waits for (until that fails once)
        self._files = _ShardFiles(cache.folder)
        self._runner: DaemonPool | None = None
        reset_after_fork(self, CacheSource._forget_parent)

    def where(self, name: str) -> str:
        return self.upstream.where(name)

    def read_file(self, name: str) -> bytes:
        return self.upstream.read_file(name)

    def read_files(self, names: Sequence[str]) -> list[bytes]:
        return self.upstream.read_files(names)

    def size(self, name: str) -> int:
        return self.upstream.size(name)

    def download(self, name: str, dest: str | os.PathLike) -> int:
        return self.upstream.download(name, dest)

    def list_names(self) -> list[str] | None:
        return self.upstream.list_names()

    def read_ranges(self, ranges: Sequence[ByteRange], check: RangeCheck | None = None) -> list[memoryview | ImgpipeError]:
        out: list[memoryview | ImgpipeError | None] = [None] * len(ranges)
        records = [self._record(r) for r in ranges]
        missing = self._read_local(ranges, records, range(len(ranges)), check, out, forget=True)
        if missing:
            missing = self._wait_for_fill(ranges, records, missing, check, out)
        if missing:
            inner = None if check is None else (lambda j, data: check(missing[j], data))
            fetched = self.upstream.read_ranges([ranges[k] for k in missing], inner)
            for k, item in zip(missing, fetched):
                out[k] = item
                record = records[k][1]
                if record >= 0 and self.trust_partial and not isinstance(item, ImgpipeError):
                    self._store(ranges[k], item, record)
        return out  # type: ignore[return-value]  (every item is set)

    def submit_ranges(self, ranges: Sequence[ByteRange], check: RangeCheck | None = None) -> Future[list[memoryview | ImgpipeError]]:
        if self._runner is None:
            self._runner = DaemonPool(4, "imgpipe-cache-read")
        return self._runner.submit(self.read_ranges, list(ranges), check)

    def _read_local(
        self, ranges: Sequence[ByteRange], records: list[tuple[int, int]], todo: Sequence[int], check: RangeCheck | None, out: list[Any],
        *, forget: bool = False,
    ) -> list[int]:  # fmt: skip
        """Read the ranges ``todo`` that the folder holds into ``out``; return the others. ``forget``:
        clear the presence of a record whose bytes fail the check (a power loss left them wrong)."""
        present, complete = self.shards.present.array, self.shards.complete.array
        missing = []
        for k in todo:
            shard, record = records[k]
            whole = shard >= 0 and bool(complete[shard])
            if whole or (record >= 0 and self.trust_partial and present[record]):
                data = self._files.read(*ranges[k])
                if data is not None and (whole or check is None or check(k, data) is None):
                    out[k] = data
                    continue
                if forget and not whole and record >= 0:
                    present[record] = 0  # fetched again below
            missing.append(k)
        return missing

    def _wait_for_fill(
        self, ranges: Sequence[ByteRange], records: list[tuple[int, int]], missing: list[int], check: RangeCheck | None, out: list[Any]
    ) -> list[int]:
        """Read the ``missing`` ranges from the folder as the background fill brings them, while it is
        due to end within ``WAIT_S`` (filling the shards that hold them meanwhile, where this process
        may); return those still missing."""
        eta = self.shards.eta.array
        began = time.time()
        while missing and eta[0] and -LATE_S < eta[0] - time.time() <= WAIT_S and time.time() - began < 2 * WAIT_S:
            if not self._help({records[k][0] for k in missing}):
                time.sleep(POLL_S)
            missing = self._read_local(ranges, records, missing, check, out)
        return missing

    def _help(self, shards: set[int]) -> bool:
        """Fill one of ``shards`` that no process of the node fills yet, with this process's own
        obstore client (a loader worker has one; the process that opened the URL has none); False if none."""
        client = getattr(self.upstream, "direct_client", lambda: None)() if self._helping else None
        if client is None:
            return False
        for s in sorted(shards):
            if s >= 0 and self.shards.claim(s):
                try:
                    self.shards.fill(s, client, self.upstream.location, self.upstream.budget_s)  # type: ignore[attr-defined]
                except (OSError, ImgpipeError):  # the records are fetched alone instead; the background fill says why it stops
                    self._helping = False
                finally:
                    self.shards.release(s)
                return True
        return False

    def _record(self, byte_range: ByteRange) -> tuple[int, int]:
        """(shard number, record index) of a range, the record -1 when the range is not exactly one record."""
        shard = self._numbers.get(byte_range.name, -1)
        if shard < 0:
            return -1, -1
        first, stop = self.shards.records(shard).start, self.shards.records(shard).stop
        offsets, ends = self.shards.offsets, self.shards.ends
        record = first + int(np.searchsorted(offsets[first:stop], byte_range.start))
        if record < stop and offsets[record] == byte_range.start and ends[record] == byte_range.end:
            return shard, record
        return shard, -1

    def _store(self, byte_range: ByteRange, data: memoryview, record: int) -> None:
        """Write a checked record whole at its offset, then mark it present (the byte after the bytes)."""
        try:
            self._files.write(byte_range.name, data, byte_range.start)
        except OSError as e:  # part of it may be there: it is not marked, and a full disk is said once
            warn_unwritable(self.folder, e)
            return
        self.shards.present.array[record] = 1

    def _forget_parent(self) -> None:
        """In a forked child: its reads get a pool of their own (the parent's threads are not in it)."""
        self._runner = None

    def close(self) -> None:
        self._files.close()
        self.upstream.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runner"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        reset_after_fork(self, CacheSource._forget_parent)


class _ShardFiles:
    """This process's descriptors of a cache folder's shard files: opened on first use, closed in a
    forked child (they are the parent's), never pickled."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._fds: dict[str, int] = {}
        reset_after_fork(self, _ShardFiles.close)

    def read(self, name: str, start: int, end: int) -> memoryview | None:
        """Bytes ``[start, end)`` of shard file ``name``, or None when the file holds fewer."""
        try:
            data = os.pread(self._fd(name), end - start, start)
        except OSError:
            return None
        return memoryview(data) if len(data) == end - start else None

    def write(self, name: str, data: memoryview, start: int) -> None:
        """Write all of ``data`` at ``start`` (its length checked: ``OSError`` when the disk takes less)."""
        write_at(self._fd(name), data, start)

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            opened = os.open(self.folder / name, os.O_RDWR | os.O_CREAT, 0o644)
            fd = self._fds.setdefault(name, opened)  # the read pool's threads may open it at once: one descriptor is kept
            if fd != opened:
                os.close(opened)
        return fd

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "_fds": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        reset_after_fork(self, _ShardFiles.close)
