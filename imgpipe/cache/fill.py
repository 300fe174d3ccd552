"""Fetch whole shards into a node-local cache: a few large streamed range GETs per shard, each record checked as it lands.

``SplitFill.fill`` brings one shard: its missing records in spans of at most ``SPAN_BYTES``
(missing runs merged across present records spanning less than ``GAP_BYTES``), each span one
streamed request whose chunks are written at their offsets as they arrive, each record they
complete checked (framing, crc32 from the sidecar) and marked present. A shard whose records are
all present and cover the file (or, without crc32s, whose file matches its sha256) is fsynced,
then marked complete. A shard is filled by one process of the node at a time: it claims the
shard's byte of ``{split}.claims`` with a lock, which its death drops.

Two kinds of process fill: the ``Filler``, a background thread of the store helper process
(which runs obstore itself and never forks), brings every shard, the opened split first, and
publishes when it expects the split to be complete (``{split}.eta``); and a loader worker that
waits for records while that fill is due (``CacheSource``) claims and fills shards holding them
itself, with its own obstore client, rather than idle. Once every shard of every split is
complete, ``NodeCache.commit`` writes the manifest.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from imgpipe.cache.nodecache import NodeCache, boot_id, warn_unwritable
from imgpipe.errors import ImgpipeError, RemoteError
from imgpipe.format.layout import SidecarError, parse_checksums
from imgpipe.format.recordio import format_index_line
from imgpipe.format.shardset import index_files, record_problem, split_index
from imgpipe.storage.source import ByteRange
from imgpipe.storage.store_client import TRANSIENT, StoreError

logger = logging.getLogger(__name__)

STREAMS = 8  # spans the background filler fetches at once
SPAN_BYTES = 64 << 20  # the most one request fetches
GAP_BYTES = 1 << 20  # present records between two missing runs that are fetched again rather than split the request
ATTEMPTS = 3  # tries to complete a shard whose records keep failing their checks
IDLE_S = 0.5  # how long the filler waits for shards that other processes claimed
ETA_EVERY_S = 0.05  # how often the expected end is published
MEASURE_S = 0.25  # the rate is measured over at least this long before it replaces the opener's guess (NodeCache.start_filling)

_fillers: dict[str, Filler] = {}
_fillers_lock = threading.Lock()
_claims_lock = threading.Lock()


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


def missing_spans(
    offsets: np.ndarray, ends: np.ndarray, missing: np.ndarray, *, gap: int = GAP_BYTES, span: int = SPAN_BYTES
) -> list[tuple[int, int]]:
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


class SplitFill:
    """The shards of one split of a cache, as the processes that fill them see them: every record's
    byte range and crc32, the node's shared maps, and this process's claims. Pickles without its
    claims (a process claims its own)."""

    def __init__(self, cache: NodeCache, name: str, offsets: np.ndarray, ends: np.ndarray, crcs: np.ndarray | None) -> None:
        info = cache.split(name)
        self.cache, self.name = cache, name
        self.rec_names = [s.name for s in info.shards]
        self.sizes = [s.bytes for s in info.shards]
        self.sha256 = [s.sha256 for s in info.shards]
        self.first = np.concatenate([[0], np.cumsum([s.records for s in info.shards])]).astype(np.int64)
        self.offsets, self.ends, self.crcs = offsets, ends, crcs
        self.present, self.complete, self.eta = cache.present(name), cache.completed(name), cache.fill_eta(name)
        self._covered: list[bool | None] = [None] * len(self.rec_names)
        self._pid: int | None = None

    def records(self, s: int) -> range:
        return range(int(self.first[s]), int(self.first[s + 1]))

    def shard_of(self, record: int) -> int:
        return int(np.searchsorted(self.first, record, side="right")) - 1

    def all_complete(self) -> bool:
        return bool(self.complete.array.all())

    # ------------------------------------------------------------------ claims

    def claim(self, s: int) -> bool:
        """Claim shard ``s`` for this process and thread; False when it is complete or filled elsewhere."""
        self._process()
        with self._lock:
            if s in self._claimed or self.complete.array[s]:
                return False
            try:
                fcntl.lockf(self._claims_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, s)
            except OSError:
                return False  # another process of the node fills it
            if self.complete.array[s]:  # completed by the process that held it a moment ago
                fcntl.lockf(self._claims_fd, fcntl.LOCK_UN, 1, s)
                return False
            self._claimed.add(s)
            return True

    def release(self, s: int) -> None:
        with self._lock:
            fcntl.lockf(self._claims_fd, fcntl.LOCK_UN, 1, s)
            self._claimed.discard(s)

    def _process(self) -> None:
        with _claims_lock:  # the threads of a process share one descriptor and one set of claims
            if self._pid != os.getpid():
                self._claims_fd = os.open(
                    self.cache.claims_path(self.name), os.O_RDWR | os.O_CREAT, 0o644
                )  # kept: closing it drops every claim on it
                self._claimed: set[int] = set()
                self._lock = threading.Lock()
                self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_claims_fd", "_claimed", "_lock")}
        state["_pid"] = None
        return state

    # ------------------------------------------------------------------ filling

    def fill(
        self, s: int, client: Any, url: str, budget_s: float, progress: Progress | None = None, stop: threading.Event | None = None
    ) -> None:
        """Bring claimed shard ``s`` whole into the folder through ``client`` (a ``DirectClient``), then mark it complete."""
        records = self.records(s)
        present = self.present.array[records.start : records.stop]
        whole = boot_id() == "unknown" or self.crcs is None or not self._is_covered(s)  # checked by the file's sha256, not record by record
        fd = os.open(self.cache.shard_path(self.rec_names[s]), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for _ in range(ATTEMPTS):
                missing = np.ones(len(records), bool) if whole else present == 0
                for a, b in missing_spans(self.offsets[records.start : records.stop], self.ends[records.start : records.stop], missing):
                    if stop is not None and stop.is_set():
                        return
                    self._fetch(fd, s, records.start + a, records.start + b, client, url, budget_s, progress)
                if self._finish(s, fd, present, whole):
                    return
        finally:
            os.close(fd)
        logger.warning("%s: %s keeps failing its checks; its records are read from the URL", self.cache.folder, self.rec_names[s])

    def _is_covered(self, s: int) -> bool:
        """True when shard ``s``'s records tile its whole file, so checked records make the file whole."""
        if self._covered[s] is None:
            a, b = self.records(s).start, self.records(s).stop
            offsets, ends = self.offsets[a:b], self.ends[a:b]
            self._covered[s] = a == b or (offsets[0] == 0 and bool(np.all(offsets[1:] == ends[:-1])) and int(ends[-1]) == self.sizes[s])
        return bool(self._covered[s])

    def _fetch(self, fd: int, s: int, first: int, stop: int, client: Any, url: str, budget_s: float, progress: Progress | None) -> None:
        """Stream records ``[first, stop)`` of shard ``s`` into its file, retrying within the retry time."""
        name = self.rec_names[s]
        deadline = time.monotonic() + budget_s
        tries = 0
        while True:
            tries += 1
            writer = _SpanWriter(fd, self, name, first, stop, progress)
            if progress is not None:
                progress.begin()
            start, end = int(self.offsets[first]), int(self.ends[stop - 1])
            done = client.stream(url, name, start, end, writer, max(0.1, deadline - time.monotonic()))
            if writer.error is not None:
                raise writer.error
            if not isinstance(done, StoreError):
                return
            if done.kind != TRANSIENT or time.monotonic() >= deadline:
                raise RemoteError(f"{url}/{name}: {done}")
            first = writer.record  # what arrived whole is kept
            if first >= stop:
                return
            time.sleep(random.uniform(0, min(2.0, 0.1 * 2**tries)))

    def _finish(self, s: int, fd: int, present: np.ndarray, whole: bool) -> bool:
        """Mark shard ``s`` complete once its file is whole (fsynced first); False when records must be fetched again."""
        if whole:
            if os.fstat(fd).st_size > self.sizes[s]:
                os.ftruncate(fd, self.sizes[s])
            if _sha256(fd) != self.sha256[s]:
                return False
        elif not present.all():
            return False
        os.fdatasync(fd)  # before the byte that says so
        self.complete.array[s] = 1
        return True


class _SpanWriter:
    """The sink of one streamed span: writes each chunk at its offset, then checks and marks the records it completes."""

    def __init__(self, fd: int, split: SplitFill, name: str, first: int, stop: int, progress: Progress | None) -> None:
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
        if self.progress is not None:
            self.progress.add(len(view))


class Progress:
    """Bytes fetched by the background filler, and the expected end of the split it fills, published from them."""

    def __init__(self) -> None:
        self.started = 0.0  # when the first span was asked for
        self.fetched = 0
        self.published = 0.0
        self.lock = threading.Lock()
        self.split: SplitFill | None = None

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
        left = sum(size for size, whole in zip(split.sizes, split.complete.array.astype(bool)) if not whole)
        split.eta.array[0] = now + left / max(rate, 1.0)


class Filler:
    """The background fill of one cache folder by this process; ``thread`` runs it."""

    def __init__(self, client: Any, cache: NodeCache, url: str, split: str) -> None:
        from imgpipe.storage.objectstore import ObjectStoreSource

        self.client = client
        self.cache = cache
        self.url = url  # the opener's: the dataset may be reachable at another URL than the one that first filled the folder
        self.upstream = ObjectStoreSource(self.url, client=client)
        self.first_split = split
        self.thread = threading.Thread(target=self.run, name="imgpipe-cache-fill", daemon=True)
        self.progress = Progress()
        self._stop = threading.Event()
        self._sidecar_keys: dict[str, np.ndarray] = {}  # the records' keys of each split opened from its index sidecar

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        try:
            self._run()
        except OSError as e:
            warn_unwritable(self.cache.folder, e)
        except ImgpipeError as e:
            _stopped(self.cache.folder, e)

    def _run(self) -> None:
        cache = self.cache
        order = sorted(cache.manifest.splits, key=lambda name: name != self.first_split)
        splits = []
        for name in order:  # one split at a time: the opened one is filled first
            split = self._load(name)
            splits.append(split)
            self.progress.split = split
            self._fill_split(split)
            split.eta.array[0] = 0.0
            if self._stop.is_set():
                return
        info = [cache.split(name) for name in order]
        for split in splits:
            if split.name in self._sidecar_keys:
                _write_shard_indexes(split, self._sidecar_keys[split.name])
        rest = [f for split in info for f in (split.sources, split.labels, *(s.index for s in split.shards))]
        cache.whole_files(rest, self.upstream.read_files)
        if all(split.all_complete() for split in splits):
            cache.commit()

    def _load(self, name: str) -> SplitFill:
        info = self.cache.split(name)
        names = index_files(info) + ([info.checksums] if info.checksums else [])
        blobs = self.cache.whole_files(names, self.upstream.read_files)
        crcs = None
        if info.checksums:
            try:
                crcs = parse_checksums(blobs.pop(), info.records)
            except SidecarError:
                crcs = None
        _, offsets, ends, keys = split_index(self.upstream.where, blobs, info)
        if info.index_sidecar:
            self._sidecar_keys[name] = keys
        return SplitFill(self.cache, name, offsets, ends, crcs)

    def _fill_split(self, split: SplitFill) -> None:
        count = len(split.rec_names)
        start = random.Random(os.getpid()).randrange(count) if count else 0  # the ranks of a node start on different shards
        order = [(start + s) % count for s in range(count)]
        workers = [
            threading.Thread(target=self._work, args=(split, order), name=f"imgpipe-cache-fill-{k}", daemon=True) for k in range(STREAMS)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def _work(self, split: SplitFill, order: list[int]) -> None:
        while not self._stop.is_set():
            s = next((s for s in order if split.claim(s)), None)
            if s is None:
                if split.all_complete():
                    return
                time.sleep(IDLE_S)  # the rest is claimed by other processes of the node: they finish it, or die and free it
                continue
            try:
                split.fill(s, self.client, self.url, self.upstream.budget_s, self.progress, self._stop)
            except OSError as e:
                warn_unwritable(self.cache.folder, e)
                self._stop.set()
            except ImgpipeError as e:
                _stopped(self.cache.folder, e)
                self._stop.set()
            finally:
                split.release(s)
            if not self.cache.current():
                self._stop.set()


def _write_shard_indexes(split: SplitFill, keys: np.ndarray) -> None:
    """Each shard's .idx the cache lacks, written from the split's ``keys`` and offsets (its index sidecar's)
    where that gives the bytes the manifest lists (as imgpipe's packs do), so that the node fetches none
    of them; the others are fetched."""
    shards = split.cache.split(split.name).shards
    lacking = set(split.cache.lacking([shard.index for shard in shards]))
    for s, shard in enumerate(shards):
        if shard.index in lacking:
            records = slice(split.records(s).start, split.records(s).stop)
            text = "".join(map(format_index_line, keys[records].tolist(), split.offsets[records].tolist()))
            split.cache.keep_if_listed(shard.index, text.encode())


def _stopped(folder: Path, error: ImgpipeError) -> None:
    logger.warning("%s: the cache stopped filling in the background (%s); the loaders fetch what they miss", folder, error)


def _sha256(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while block := os.pread(fd, 8 << 20, offset):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()
