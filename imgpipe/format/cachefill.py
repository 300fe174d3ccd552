"""Fetch the rest of a dataset into its node-local cache: whole shards, each in a few large streamed range GETs.

Runs in a store helper process (``store_helper``), which runs obstore itself and never forks,
beside the loaders that read through the cache: the filler brings whole shards (the opened
split's first) while the loaders read what is there, so more and more of an epoch is read from
the folder, at a few requests per shard. Each shard is claimed by one process of the node (a
lock on its byte of ``{split}.claims``, dropped with the process), so the ranks of a node and
their helpers never fetch a shard twice.

A shard's missing records are fetched in spans of at most ``SPAN_BYTES`` (missing runs merged
across present records spanning less than ``GAP_BYTES``), ``STREAMS`` spans at a time. Each
span is streamed: a chunk is written at its offset as it arrives, and each record it completes is
checked (framing, crc32 from the sidecar) and marked present. A shard whose records are all
present and cover the file (or, without crc32s, whose file matches its sha256) is fsynced, then
marked complete. The filler also publishes when it expects the split to be complete
(``{split}.eta``): a loader that misses records waits for a fill due soon rather than fetching
them one request each. Once every shard of every split is complete, ``NodeCache.commit`` writes
the manifest.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from imgpipe.errors import ImgpipeError, RemoteError
from imgpipe.format.bytesource import ByteRange
from imgpipe.format.layout import SidecarError, parse_checksums
from imgpipe.format.nodecache import NodeCache, SharedArray, boot_id, warn_unwritable
from imgpipe.format.shardset import record_problem, split_index
from imgpipe.format.store_client import TRANSIENT, StoreError

logger = logging.getLogger(__name__)

STREAMS = 8  # spans fetched at once by one filler
SPAN_BYTES = 64 << 20  # the most one request fetches
GAP_BYTES = 1 << 20  # present records between two missing runs that are fetched again rather than split the request
ATTEMPTS = 3  # tries to complete a shard whose records keep failing their checks
IDLE_S = 0.5  # how long a filler waits for shards that other processes claimed
ETA_EVERY_S = 0.05  # how often the expected end is published
MEASURE_S = 0.25  # the rate is measured over at least this long before it replaces the opener's guess (NodeCache.start_filling)

_fillers: dict[str, Filler] = {}
_fillers_lock = threading.Lock()


def start(client: Any, url: str, folder: str, split: str) -> bool:
    """Start filling ``folder`` (a cache of ``url``) in this process, unless it is being filled here already."""
    cache = NodeCache.attach(folder)
    if cache is None:
        return False
    with _fillers_lock:
        filler = _fillers.get(folder)
        if filler is not None and filler.thread.is_alive():
            if filler.cache.version == cache.version:
                return False
            filler.stop()  # the folder moved on to another version of the dataset
        filler = _fillers[folder] = Filler(client, cache, url, split)
        filler.thread.start()
    return True


def missing_spans(offsets: np.ndarray, ends: np.ndarray, missing: np.ndarray, *, gap: int = GAP_BYTES, span: int = SPAN_BYTES) -> list[tuple[int, int]]:
    """The record ranges ``[first, stop)`` to fetch for the records ``missing`` marks (records in file order):
    runs of missing records, merged across present ones spanning less than ``gap`` bytes, cut where a
    range would pass ``span`` bytes (a record larger than that is a range of its own)."""
    todo = np.flatnonzero(missing)
    spans: list[tuple[int, int]] = []
    if todo.size == 0:
        return spans
    first = prev = int(todo[0])
    for record in todo[1:].tolist():
        if offsets[record] - ends[prev] >= gap or ends[record] - offsets[first] > span:
            spans.append((first, prev + 1))
            first = record
        prev = record
    spans.append((first, prev + 1))
    return spans


@dataclass
class _Split:
    """What the filler knows of one split."""

    name: str
    rec_names: list[str]
    sizes: list[int]
    sha256: list[str]
    first: np.ndarray  # each shard's first record, then the record count
    offsets: np.ndarray
    ends: np.ndarray
    crcs: np.ndarray | None
    present: SharedArray
    complete: SharedArray
    eta: SharedArray
    claims_fd: int
    covered: np.ndarray  # per shard: its records tile the whole file, so checked records make it whole

    def records(self, s: int) -> range:
        return range(int(self.first[s]), int(self.first[s + 1]))


class _SpanWriter:
    """The sink of one streamed span: writes each chunk at its offset, then checks and marks the records it completes."""

    def __init__(self, fd: int, split: _Split, name: str, first: int, stop: int, progress: _Progress) -> None:
        self.fd, self.split, self.name, self.progress = fd, split, name, progress
        self.record, self.stop = first, stop
        self.parts: list[bytes] = []  # the head of a record that began in an earlier chunk
        self.error: OSError | None = None  # a failed write: it ends the request and the filling

    def __call__(self, at: int, chunk: Any) -> None:
        view = memoryview(chunk)
        try:
            os.pwrite(self.fd, view, at)
        except OSError as e:
            self.error = e
            raise
        end = at + len(view)
        split, present = self.split, self.split.present.array
        while self.record < self.stop:
            start, stop = int(split.offsets[self.record]), int(split.ends[self.record])
            if stop > end:
                self.parts.append(bytes(view[max(start, at) - at :]))
                break
            data = memoryview(b"".join([*self.parts, view[: stop - at]])) if self.parts else view[start - at : stop - at]
            self.parts = []
            crc = None if split.crcs is None else int(split.crcs[self.record])
            if record_problem(data, ByteRange(self.name, start, stop), crc) is None:
                present[self.record] = 1
            self.record += 1
        self.progress.add(len(view))


class _Progress:
    """Bytes fetched by this filler, and the expected end of each split's fill published from them."""

    def __init__(self) -> None:
        self.started = 0.0  # when the first span was asked for
        self.fetched = 0
        self.published = 0.0
        self.lock = threading.Lock()
        self.split: _Split | None = None

    def begin(self) -> None:
        with self.lock:
            self.started = self.started or time.time()

    def add(self, count: int) -> None:
        with self.lock:
            self.fetched += count
            now = time.time()
            if self.split is None or now - self.published < ETA_EVERY_S or now - self.started < MEASURE_S:
                return
            self.published = now
        split = self.split
        rate = self.fetched / max(now - self.started, 1e-3)
        done = split.complete.array.astype(bool)
        left = sum(size for size, whole in zip(split.sizes, done) if not whole)
        split.eta.array[0] = now + left / max(rate, 1.0)


class Filler:
    """One cache folder being filled by this process; ``thread`` runs it."""

    def __init__(self, client: Any, cache: NodeCache, url: str, split: str) -> None:
        from imgpipe.format.objectstore import ObjectStoreSource

        self.client = client
        self.cache = cache
        self.url = url  # the opener's: the dataset may be reachable at another URL than the one that first filled the folder
        self.upstream = ObjectStoreSource(self.url, client=client)
        self.folder = str(cache.folder)
        self.first_split = split
        self.thread = threading.Thread(target=self.run, name="imgpipe-cache-fill", daemon=True)
        self.progress = _Progress()
        self._claimed: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        try:
            self._run()
        except OSError as e:
            warn_unwritable(Path(self.folder), e)
        except ImgpipeError as e:
            _stopped(self.folder, e)

    def _run(self) -> None:
        cache = self.cache
        self.by_sha = boot_id() == "unknown"
        order = sorted(cache.manifest.splits, key=lambda name: name != self.first_split)
        self.splits: dict[str, _Split] = {}
        for name in order:  # one split at a time: the opened one is filled while the next one's index is read
            self.splits[name] = self._load(name)
            self.progress.split = self.splits[name]
            self._fill_split(name)
            self.splits[name].eta.array[0] = 0.0
            if self._stop.is_set():
                return
        info = [cache.split(name) for name in order]
        cache.whole_files([f for split in info for f in (split.sources, split.labels)], self.upstream.read_files)
        if all(bool(split.complete.array.all()) for split in self.splits.values()):
            cache.commit()

    def _fill_split(self, name: str) -> None:
        count = len(self.splits[name].rec_names)
        start = random.Random(os.getpid()).randrange(count) if count else 0  # the ranks of a node start on different shards
        self.jobs = [(name, (start + s) % count) for s in range(count)]
        workers = [threading.Thread(target=self._work, name=f"imgpipe-cache-fill-{k}", daemon=True) for k in range(STREAMS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def _load(self, name: str) -> _Split:
        info = self.cache.split(name)
        names = [s.index for s in info.shards] + ([info.checksums] if info.checksums else [])
        blobs = self.cache.whole_files(names, self.upstream.read_files)
        crcs = None
        if info.checksums:
            try:
                crcs = parse_checksums(blobs.pop(), info.records)
            except SidecarError:
                crcs = None
        _, offsets, ends, _ = split_index(self.upstream.where, blobs, info)
        first = np.concatenate([[0], np.cumsum([s.records for s in info.shards])]).astype(np.int64)
        covered = np.array([
            stop == start or (offsets[start] == 0 and bool(np.all(offsets[start + 1 : stop] == ends[start : stop - 1])) and ends[stop - 1] == shard.bytes)
            for start, stop, shard in zip(first[:-1], first[1:], info.shards)
        ])  # fmt: skip
        claims = os.open(self.cache.claims_path(name), os.O_RDWR | os.O_CREAT, 0o644)  # kept open: closing it drops every claim on it
        return _Split(
            name, [s.name for s in info.shards], [s.bytes for s in info.shards], [s.sha256 for s in info.shards], first, offsets, ends,
            crcs, self.cache.present(name), self.cache.completed(name), self.cache.fill_eta(name), claims, covered,
        )  # fmt: skip

    def _work(self) -> None:
        while not self._stop.is_set():
            job = self._claim()
            if job is None:
                name = self.jobs[0][0] if self.jobs else ""
                if not self.jobs or self.splits[name].complete.array.all():
                    return
                time.sleep(IDLE_S)  # the rest is claimed by other processes of the node: they finish it, or die and free it
                continue
            try:
                self._fill(*job)
            except OSError as e:
                warn_unwritable(self.cache.folder, e)
                self._stop.set()
            except ImgpipeError as e:
                _stopped(self.folder, e)
                self._stop.set()
            finally:
                self._release(*job)
            if not self.cache.current():
                self._stop.set()

    def _claim(self) -> tuple[str, int] | None:
        with self._lock:
            for name, s in self.jobs:
                split = self.splits[name]
                if (name, s) in self._claimed or split.complete.array[s]:
                    continue
                try:
                    fcntl.lockf(split.claims_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, s)
                except OSError:
                    continue  # another process of the node fills it
                self._claimed.add((name, s))
                return name, s
        return None

    def _release(self, name: str, s: int) -> None:
        with self._lock:
            fcntl.lockf(self.splits[name].claims_fd, fcntl.LOCK_UN, 1, s)
            self._claimed.discard((name, s))

    def _fill(self, name: str, s: int) -> None:
        split = self.splits[name]
        records = split.records(s)
        present = split.present.array[records.start : records.stop]
        whole = self.by_sha or split.crcs is None or not split.covered[s]  # checked by the file's sha256, not record by record
        fd = os.open(self.cache.shard_path(split.rec_names[s]), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for _ in range(ATTEMPTS):
                missing = np.ones(len(records), bool) if whole else present == 0
                for a, b in missing_spans(split.offsets[records.start : records.stop], split.ends[records.start : records.stop], missing):
                    if self._stop.is_set():
                        return
                    self._fetch(fd, split, s, records.start + a, records.start + b)
                if self._finish(split, s, fd, present, whole):
                    return
        finally:
            os.close(fd)
        logger.warning("%s: %s keeps failing its checks; its records are read from the URL", self.folder, split.rec_names[s])

    def _fetch(self, fd: int, split: _Split, s: int, first: int, stop: int) -> None:
        """Stream records ``[first, stop)`` of shard ``s`` into its file, retrying within the retry time."""
        name = split.rec_names[s]
        budget = self.upstream.budget_s
        deadline = time.monotonic() + budget
        tries = 0
        while True:
            tries += 1
            writer = _SpanWriter(fd, split, name, first, stop, self.progress)
            self.progress.begin()
            start, end = int(split.offsets[first]), int(split.ends[stop - 1])
            done = self.client.stream(self.url, name, start, end, writer, max(0.1, deadline - time.monotonic()))
            if writer.error is not None:
                raise writer.error
            if not isinstance(done, StoreError):
                return
            if done.kind != TRANSIENT or time.monotonic() >= deadline:
                raise RemoteError(f"{self.url}/{name}: {done}")
            first = writer.record  # what arrived whole is kept
            if first >= stop:
                return
            time.sleep(random.uniform(0, min(2.0, 0.1 * 2**tries)))

    def _finish(self, split: _Split, s: int, fd: int, present: np.ndarray, whole: bool) -> bool:
        """Mark shard ``s`` complete once its file is whole (fsynced first); False when records must be fetched again."""
        if whole:
            if os.fstat(fd).st_size > split.sizes[s]:
                os.ftruncate(fd, split.sizes[s])
            if _sha256(fd) != split.sha256[s]:
                return False
        elif not present.all():
            return False
        os.fdatasync(fd)  # before the byte that says so
        split.complete.array[s] = 1
        return True


def _stopped(folder: str, error: ImgpipeError) -> None:
    logger.warning("%s: the cache stopped filling in the background (%s); the loaders fetch what they miss", folder, error)


def _sha256(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while block := os.pread(fd, 8 << 20, offset):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()
