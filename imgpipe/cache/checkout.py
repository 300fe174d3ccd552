"""Which dataset version a cache folder holds, and who uses it: a process checks the folder out before it reads.

Every process that uses a cache holds its ``lock`` shared (its lease, until it exits). A process
that opens the folder for another version of the dataset (its manifest changed upstream) takes
that lock exclusively, so no process still reads the old one, empties the folder and starts it
afresh with a warning; while another process holds a lease, that is one ``DatasetError`` line.
All of this happens under ``init.lock``, one process at a time. The first process of a new boot
forgets the presence of every shard that is not complete (see ``nodecache``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import numpy as np

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.diskinfo import format_bytes, free_bytes
from imgpipe._sys.jsonfile import loads
from imgpipe._sys.oserrors import describe
from imgpipe._sys.pidlock import lock_file, locked
from imgpipe._sys.regular import read_regular
from imgpipe.cache.nodecache import SOURCE_NAME, STATE_DIR, NodeCache, cached_version, writable_again
from imgpipe.errors import ConfigError, DatasetError
from imgpipe.format.manifest import MANIFEST_NAME, Manifest, parse_manifest
from imgpipe.storage.source import ByteSource

logger = logging.getLogger(__name__)

BOOT_NAME = "boot_id"
LOCK_NAME, INIT_LOCK_NAME = "lock", "init.lock"

_leases: dict[tuple[int, str], int] = {}  # (process, folder) -> the descriptor holding ``lock`` shared
_leases_lock = threading.Lock()


def open_cache(folder: str | os.PathLike, upstream: ByteSource, manifest_bytes: bytes, manifest: Manifest) -> NodeCache:
    """The cache in ``folder`` of the dataset whose manifest is ``manifest_bytes``, checked out for this process.

    A new or empty folder becomes the cache; a cache of another version of the dataset is emptied
    and started afresh (a warning says so), unless another process still uses it (one
    ``DatasetError`` line); any other non-empty folder is refused. Fails up front when the folder's
    disk cannot hold the rest of the dataset.
    """
    cache = NodeCache(Path(folder), upstream.location, manifest_bytes, manifest)
    state = cache.state_dir
    try:
        if cache.folder.is_dir() and not state.is_dir() and any(cache.folder.iterdir()):
            raise ConfigError(
                f"{cache.folder}: cache_dir holds files and is no imgpipe cache (no {STATE_DIR}/ in it); give an empty or new folder"
            )
        state.mkdir(parents=True, exist_ok=True)
        with locked(state / INIT_LOCK_NAME):
            _check_out(cache)
            check_space(cache)
            cache.allocate_state()
            writable_again(cache.folder)
    except OSError as e:
        raise DatasetError(f"{cache.folder}: cannot use as cache_dir: {describe(e, writing=True)}") from None
    return cache


def attach(folder: str | os.PathLike) -> NodeCache | None:
    """The cache a process of this node opened in ``folder`` (for its background filler), or None if it is gone."""
    state = Path(folder) / STATE_DIR
    try:
        source = loads(read_regular(state / SOURCE_NAME))
        manifest_bytes = read_regular(state / MANIFEST_NAME)
    except (OSError, ValueError):
        return None
    if not isinstance(source, dict):
        return None
    cache = NodeCache(Path(folder), str(source.get("url", "")), manifest_bytes, parse_manifest(manifest_bytes, state / MANIFEST_NAME))
    return cache if cache.version == source.get("manifest_sha256") else None


def check_space(cache: NodeCache) -> None:
    """A ``DatasetError`` when the folder's disk cannot hold what the dataset still needs."""
    total = allocated = 0
    shards = [(shard.name, shard.bytes) for split in cache.manifest.splits.values() for shard in split.shards]
    for name, size in [*shards, *((n, s) for n, (s, _) in cache.files.items())]:
        size = size if size is not None else 0
        total += size
        try:
            allocated += min(size, os.stat(cache.folder / name).st_blocks * 512)
        except OSError:
            pass
    needed, free = total - allocated, free_bytes(cache.folder)
    if needed > free:
        raise DatasetError(
            f"{cache.folder}: cache_dir needs {format_bytes(needed)} more for {cache.url} ({format_bytes(total)} in all) but its disk has "
            f"{format_bytes(free)} free; free some space, give another cache_dir, or read the URL without one"
        )


def boot_id() -> str:
    """This boot of the machine (Linux's ``boot_id``): page-cache writes of an earlier one may be lost."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"  # no boot id: presence bytes are never cleared; a shard is still completed by its sha256 only


def _check_out(cache: NodeCache) -> None:
    """Under ``init.lock``: take this version's lease, (re)initialising the folder when it holds another."""
    key = (os.getpid(), str(cache.folder.resolve()))
    lock = cache.state_dir / LOCK_NAME
    if cached_version(cache.folder) == cache.version:
        with _leases_lock:
            if key not in _leases:
                _leases[key] = lock_file(lock, shared=True)  # type: ignore[assignment]  (a waiting lock is always taken)
        _forget_other_boots(cache)
        return
    with _leases_lock:
        ours = _leases.pop(key, None)
    if ours is not None:  # this process used the old version: it moves on
        os.close(ours)
    fd = lock_file(lock, wait=False)
    if fd is None:
        raise DatasetError(
            f"{cache.folder}: cache_dir holds another version of {cache.url} (its manifest changed) and another process still "
            "reads it; wait for that run to end, or give this one another cache_dir"
        )
    try:
        if cached_version(cache.folder) is not None:
            logger.warning(
                "%s: the dataset at %s changed since it was cached (its manifest differs): starting the cache afresh",
                cache.folder,
                cache.url,
            )
        _empty(cache)
        atomic_write_bytes(cache.state_dir / MANIFEST_NAME, cache.manifest_bytes)
        atomic_write_bytes(cache.state_dir / BOOT_NAME, boot_id().encode())
        atomic_write_bytes(cache.state_dir / SOURCE_NAME, json.dumps({"url": cache.url, "manifest_sha256": cache.version}).encode())
    finally:
        os.close(fd)  # no other process checks out meanwhile: they all wait for init.lock
    with _leases_lock:
        _leases[key] = lock_file(lock, shared=True)  # type: ignore[assignment]


def _forget_other_boots(cache: NodeCache) -> None:
    """Clear the presence bytes a previous boot wrote (a power loss may have kept them and lost their
    records); complete shards were fsynced and keep theirs."""
    try:
        written = (cache.state_dir / BOOT_NAME).read_text()
    except OSError:
        written = ""
    if written == boot_id():
        return
    for split in cache.manifest.splits:
        present, complete = cache.present(split).array, cache.completed(split).array
        first = np.concatenate([[0], np.cumsum([s.records for s in cache.split(split).shards])])
        for s in np.flatnonzero(complete == 0).tolist():
            present[first[s] : first[s + 1]] = 0
    atomic_write_bytes(cache.state_dir / BOOT_NAME, boot_id().encode())


def _empty(cache: NodeCache) -> None:
    """Remove every file of the cached dataset and of its state (not the locks)."""
    (cache.state_dir / SOURCE_NAME).unlink(missing_ok=True)  # first: a folder half emptied is no version
    (cache.folder / MANIFEST_NAME).unlink(missing_ok=True)
    for folder in (cache.folder, cache.state_dir):
        for path in folder.iterdir():
            if path.is_file() and path.name not in (LOCK_NAME, INIT_LOCK_NAME):
                path.unlink()
