"""Bring one shard of a cache whole: a few large streamed range GETs into its ``RangeFile``, each record checked as it lands.

The shard is written and committed through staging's ``RangeFile``, as ``imgpipe stage`` copies a file,
and checked from the disk before it is complete: every record's framing, crc32 and zero padding where
the records tile the file (a pass of crc32 costs a tenth of a sha256's CPU), else its sha256. The cache adds
per-record presence (the first epoch reads records while their shards arrive): the missing bytes come
in streamed spans of at most ``SPAN_BYTES``, each record a chunk completes checked and marked present
once written whole. One process of the node fills a shard at a time, holding its byte of ``{split}.claims``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import threading
import time
from typing import Any

import numpy as np

from imgpipe._sys.checksum import crc32
from imgpipe._sys.forks import reset_after_fork
from imgpipe.cache.nodecache import NodeCache
from imgpipe.errors import RemoteError
from imgpipe.format.recordio import slack_problem
from imgpipe.format.shardset import record_problem
from imgpipe.staging.rangefile import RangeFile
from imgpipe.storage.source import ByteRange
from imgpipe.storage.store_client import TRANSIENT, StoreError

logger = logging.getLogger(__name__)

SPAN_BYTES = 64 << 20  # the most one request fetches
GAP_BYTES = 1 << 20  # present records between two missing runs that are fetched again rather than split the request
ATTEMPTS = 3  # tries to complete a shard whose file keeps hashing wrong (the second and third fetch all of it)

_claims_lock = threading.Lock()


def fetch_spans(
    offsets: np.ndarray, ends: np.ndarray, present: np.ndarray, size: int, *, gap: int = GAP_BYTES, span: int = SPAN_BYTES
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(byte ranges to fetch, byte ranges kept) of a shard file of ``size`` bytes whose records (in file
    order) are at ``offsets``/``ends`` and marked by ``present``; together they tile ``[0, size)``. A
    kept run shorter than ``gap`` between two fetched ranges is fetched again with them; a fetched
    range is cut at record starts to at most ``span`` bytes (a record larger than that is one range)."""
    kept: list[list[int]] = []
    for record in np.flatnonzero(present).tolist():
        start, end = int(offsets[record]), int(ends[record])
        if kept and kept[-1][1] == start:
            kept[-1][1] = end
        else:
            kept.append([start, end])
    fetched: list[list[int]] = []
    at = 0
    for start, end in kept:
        if start > at:
            fetched.append([at, start])
        at = end
    if at < size:
        fetched.append([at, size])
    merged: list[list[int]] = []  # fetched ranges joined across short kept runs
    for piece in fetched:
        if merged and piece[0] - merged[-1][1] < gap:
            merged[-1][1] = piece[1]
        else:
            merged.append(piece)
    cut: list[tuple[int, int]] = []
    for start, end in merged:
        while end - start > span:
            inside = offsets[(offsets > start) & (offsets <= start + span)]
            later = offsets[(offsets > start + span) & (offsets < end)]
            stop = int(inside.max()) if inside.size else int(later.min()) if later.size else end
            cut.append((start, stop))
            start = stop
        if start < end:
            cut.append((start, end))
    keep, at = [], 0
    for start, end in cut:
        if start > at:
            keep.append((at, start))
        at = end
    if at < size:
        keep.append((at, size))
    return cut, keep


def tiles(offsets: np.ndarray, ends: np.ndarray, size: int) -> bool:
    """True when a shard's records (in file order) cover its ``size`` bytes end to end, so that checking
    every record checks every byte of the file."""
    return len(offsets) > 0 and int(offsets[0]) == 0 and int(ends[-1]) == size and bool(np.all(ends[:-1] == offsets[1:]))


def failing_on_disk(fd: int, name: str, offsets: np.ndarray, ends: np.ndarray, crcs: np.ndarray) -> dict[int, int]:
    """The records of an open shard file whose bytes, read back from the disk, fail their framing, crc32 or
    padding (zeros, up to the next record): record number (in the shard) -> crc32 of the bytes found. Where the
    records tile the file, every byte of it is checked so."""
    failing = {}
    for r, (start, end) in enumerate(zip(offsets.tolist(), ends.tolist())):
        data = os.pread(fd, end - start, start)
        if (
            len(data) != end - start
            or record_problem(memoryview(data), ByteRange(name, start, end), int(crcs[r])) is not None
            or slack_problem(data) is not None
        ):
            failing[r] = crc32(data)
    return failing


class SplitFill:
    """The shards of one split of a cache, as the processes that fill them see them: every record's
    byte range and crc32, the node's shared maps, and this process's claims. Pickles without its
    claims (a process claims its own; a forked child drops its parent's)."""

    def __init__(self, cache: NodeCache, name: str, offsets: np.ndarray, ends: np.ndarray, crcs: np.ndarray | None) -> None:
        info = cache.split(name)
        self.cache, self.name = cache, name
        self.rec_names = [s.name for s in info.shards]
        self.sizes = [s.bytes for s in info.shards]
        self.sha256 = [s.sha256 for s in info.shards]
        self.first = np.concatenate([[0], np.cumsum([s.records for s in info.shards])]).astype(np.int64)
        self.offsets, self.ends, self.crcs = offsets, ends, crcs
        self.present, self.complete, self.eta = cache.present(name), cache.completed(name), cache.fill_eta(name)
        self._claims_fd: int | None = None
        self._claimed: set[int] = set()
        self.given_up: set[int] = set()  # shards this process found damaged or failing: not claimed again, their records read alone
        self._lock = threading.Lock()
        reset_after_fork(self, SplitFill._drop_claims)

    def records(self, s: int) -> range:
        return range(int(self.first[s]), int(self.first[s + 1]))

    def all_complete(self) -> bool:
        return bool(self.complete.array.all())

    def all_settled(self) -> bool:
        """Every shard is complete, or given up by this process."""
        return all(self.complete.array[s] or s in self.given_up for s in range(len(self.rec_names)))

    # ------------------------------------------------------------------ claims

    def claim(self, s: int) -> bool:
        """Claim shard ``s`` for this process and thread; False when it is complete, given up, or filled elsewhere."""
        with self._lock:
            if s in self._claimed or s in self.given_up or self.complete.array[s]:
                return False
            fd = self._claims()
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, s)
            except OSError:
                return False  # another process of the node fills it
            if self.complete.array[s]:  # completed by the process that held it a moment ago
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, s)
                return False
            self._claimed.add(s)
            return True

    def release(self, s: int) -> None:
        with self._lock:
            if s in self._claimed:
                fcntl.lockf(self._claims(), fcntl.LOCK_UN, 1, s)
                self._claimed.discard(s)

    def _claims(self) -> int:
        """This process's descriptor of the claims file (kept open: closing it drops every claim on it)."""
        with _claims_lock:
            if self._claims_fd is None:
                self._claims_fd = os.open(self.cache.claims_path(self.name), os.O_RDWR | os.O_CREAT, 0o644)
            return self._claims_fd

    def _drop_claims(self) -> None:
        """In a forked child: the claims were the parent's (record locks are not inherited)."""
        if self._claims_fd is not None:
            os.close(self._claims_fd)
        self._claims_fd, self._claimed, self._lock = None, set(), threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_claims_fd=None, _claimed=set(), _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        reset_after_fork(self, SplitFill._drop_claims)

    # ------------------------------------------------------------------ filling

    def fill(self, s: int, client: Any, url: str, budget_s: float, progress: Any = None, stop: threading.Event | None = None) -> None:
        """Bring claimed shard ``s`` whole into the folder through ``client`` (a ``DirectClient``), then mark
        it complete. ``OSError``: the folder cannot be written (nothing more is marked)."""
        records = self.records(s)
        offsets, ends = self.offsets[records.start : records.stop], self.ends[records.start : records.stop]
        present = self.present.array[records.start : records.stop]

        def bring(file: RangeFile) -> bool:
            """Fetch what is not present into ``file``; False if told to stop."""
            spans, kept = fetch_spans(offsets, ends, present != 0, self.sizes[s])
            for start, end in kept:
                file.landed(start, end)
            for start, end in spans:
                if stop is not None and stop.is_set():
                    return False
                self._fetch(file, s, start, end, client, url, budget_s, progress)
            return True

        path, size = self.cache.shard_path(self.rec_names[s]), self.sizes[s]
        if self.crcs is not None and tiles(offsets, ends, size):
            crcs, wrong = self.crcs[records.start : records.stop], {}  # record -> crc32 of the wrong bytes the last check found
            for _ in range(ATTEMPTS):
                with RangeFile(path, size, keep=True, hashing=False) as file:
                    if not bring(file):
                        return
                    failing = failing_on_disk(file.fd, self.rec_names[s], offsets, ends, crcs)
                    if not failing and file.commit(None):  # every record checked from the disk, then fsynced: only now complete
                        self.complete.array[s] = 1
                        return
                present[list(failing)] = 0  # fetched again, alone
                if any(wrong.get(r) == crc for r, crc in failing.items()):
                    return self._warn_damaged(s, url, "records of it fail their checks twice alike")
                wrong = failing
        else:
            hashes: set[str] = set()  # the sha256 of each whole fetch that hashed wrong
            for attempt in range(ATTEMPTS):
                if attempt or self.crcs is None:  # without crc32s no record is checked alone; after a wrong hash all is fetched again
                    present[:] = 0
                with RangeFile(path, size, keep=True) as file:
                    if not bring(file):
                        return
                    if file.commit(self.sha256[s]):  # hashed from the disk, then fsynced: only now is it complete
                        self.complete.array[s] = 1
                        return
                    if attempt and file.done and file.sha256() in hashes:  # the same wrong bytes twice: what the store holds
                        return self._warn_damaged(s, url, "it differs from the manifest's sha256 twice alike")
                    if attempt and file.done:
                        hashes.add(file.sha256())
        self.given_up.add(s)
        logger.warning("%s: %s keeps failing its checks; its records are read from the URL", self.cache.folder, self.rec_names[s])

    def _warn_damaged(self, s: int, url: str, how: str) -> None:
        self.given_up.add(s)
        logger.warning(
            "%s: %s: %s: the stored shard is damaged; its records are read from the URL, each checked; run 'imgpipe verify %s'",
            self.cache.folder, self.rec_names[s], how, url,
        )  # fmt: skip

    def _fetch(self, file: RangeFile, s: int, start: int, end: int, client: Any, url: str, budget_s: float, progress: Any) -> None:
        """Stream bytes ``[start, end)`` of shard ``s`` into its file, retrying within the retry time."""
        name = self.rec_names[s]
        deadline = time.monotonic() + budget_s
        tries = 0
        while True:
            tries += 1
            writer = _SpanWriter(file, self, s, start, end, progress)
            if progress is not None:
                progress.begin()
            done = client.stream(url, name, start, end, writer, max(0.1, deadline - time.monotonic()))
            if writer.error is not None:
                raise writer.error
            if not isinstance(done, StoreError):
                return
            if done.kind != TRANSIENT or time.monotonic() >= deadline:
                raise RemoteError(f"{url}/{name}: {done}")
            start = writer.resume_at()  # what arrived whole is kept
            if start >= end:
                return
            time.sleep(random.uniform(0, min(2.0, 0.1 * 2**tries)))


class _SpanWriter:
    """The sink of one streamed span: writes each chunk at its offset, then checks and marks the records it completes."""

    def __init__(self, file: RangeFile, split: SplitFill, s: int, start: int, end: int, progress: Any) -> None:
        self.file, self.split, self.progress = file, split, progress
        self.name = split.rec_names[s]
        first = split.records(s).start
        offsets, ends = split.offsets[first : split.records(s).stop], split.ends[first : split.records(s).stop]
        self.record = first + int(np.searchsorted(offsets, start))  # the first record that starts in the span
        self.stop = first + int(np.searchsorted(ends, end, side="right"))  # past the last one that ends in it
        self.at = start
        self.parts: list[bytes] = []  # the head of a record that began in an earlier chunk
        self.error: OSError | None = None  # a failed write: it ends the request and the filling

    def resume_at(self) -> int:
        """Where a new request for the rest of the span starts: the first record not yet whole."""
        return int(self.split.offsets[self.record]) if self.record < self.stop else self.at

    def __call__(self, at: int, chunk: Any) -> None:
        view = memoryview(chunk)
        try:
            self.file.write(at, view)
        except OSError as e:
            self.error = e
            raise
        end = at + len(view)
        self.at = end
        self.file.landed(at, end)
        split, present = self.split, self.split.present.array
        while self.record < self.stop:
            start, stop = int(split.offsets[self.record]), int(split.ends[self.record])
            if stop > end:
                if start < end:
                    self.parts.append(bytes(view[max(start, at) - at :]))
                break
            if self.parts:  # its head came in earlier chunks
                data = memoryview(b"".join([*self.parts, view[: stop - at]]))
            else:
                data = view[start - at : stop - at]
            self.parts = []
            if split.crcs is not None and record_problem(data, ByteRange(self.name, start, stop), int(split.crcs[self.record])) is None:
                present[self.record] = 1  # checked, and written whole above
            self.record += 1
        if self.progress is not None:
            self.progress.add(len(view))
