"""The background fill of a node cache: every shard of every split fetched into the folder, the opened split first.

It runs as a ``module:function`` job (``start``) in the store helper of the process that opened the URL:
``STREAMS`` threads claim shards no process of the node fills yet and bring each whole (``shardfill``),
while the split's expected end (``{split}.eta``) is published so that loaders know whether to wait for a
record or fetch it alone. Once every shard is complete the ``.idx`` files are written and
``files.commit`` writes the manifest; a disk that cannot be written stops the fill with one warning.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from imgpipe.cache.checkout import attach
from imgpipe.cache.files import commit as commit_cache
from imgpipe.cache.files import keep_if_listed, lacking, whole_files
from imgpipe.cache.nodecache import NodeCache, warn_unwritable
from imgpipe.cache.shardfill import SplitFill
from imgpipe.errors import ImgpipeError
from imgpipe.format.files import SidecarError, parse_checksums
from imgpipe.format.recordio import format_index_line
from imgpipe.format.shardset import index_files, split_index
from imgpipe.storage.source import ByteSource

logger = logging.getLogger(__name__)

STREAMS = 8  # shards the background filler fetches at once
GUESSED_FILL_BYTES_PER_S = 250e6  # a node's fill rate, until the filler measures its own
IDLE_S = 0.5  # how long the filler waits for shards that other processes claimed
ETA_EVERY_S = 0.05  # how often the expected end is published
MEASURE_S = 0.25  # the rate is measured over at least this long before it replaces the opener's guess (start_filling)

_fillers: dict[str, Filler] = {}
_fillers_lock = threading.Lock()


def start_filling(cache: NodeCache, split: str, upstream: ByteSource) -> None:
    """Have this process's store helper fetch the rest of the dataset into the folder, ``split`` first;
    until the filler has measured its rate, its end is guessed at ``GUESSED_FILL_BYTES_PER_S``."""
    from imgpipe.storage.store_helper import HelperClient

    eta, info = cache.fill_eta(split).array, cache.split(split)
    if eta[0] < time.time():
        done = cache.completed(split).array
        left = sum(shard.bytes for shard, whole in zip(info.shards, done) if not whole)
        eta[0] = time.time() + left / GUESSED_FILL_BYTES_PER_S
    HelperClient.shared(getattr(upstream, "budget_s", 30.0)).start("imgpipe.cache.fill:start", cache.url, str(cache.folder), split)


def start(client: Any, url: str, folder: str, split: str) -> bool:
    """Start filling ``folder`` (a cache of ``url``) in this process, unless it is being filled here already."""
    cache = attach(folder)
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
        whole_files(cache, rest, self.upstream.read_files)
        if all(split.all_complete() for split in splits):
            commit_cache(cache)

    def _load(self, name: str) -> SplitFill:
        info = self.cache.split(name)
        names = index_files(info) + ([info.checksums] if info.checksums else [])
        blobs = whole_files(self.cache, names, self.upstream.read_files)
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
                if split.all_settled():
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
    missing = set(lacking(split.cache, [shard.index for shard in shards]))
    for s, shard in enumerate(shards):
        if shard.index in missing:
            records = slice(split.records(s).start, split.records(s).stop)
            text = "".join(map(format_index_line, keys[records].tolist(), split.offsets[records].tolist()))
            keep_if_listed(split.cache, shard.index, text.encode())


def _stopped(folder: Path, error: ImgpipeError) -> None:
    logger.warning("%s: the cache stopped filling in the background (%s); the loaders fetch what they miss", folder, error)
