"""The files of a cache folder other than its shards (the ``.idx`` files and sidecars), and the commit that ends the cache.

They are kept whole, each checked against the manifest's sha256 whenever it is read from the folder;
one process of the node fetches those it lacks at a time (under ``init.lock``), so the ranks of a
node that open the dataset together fetch its index once. ``commit`` writes the manifest once every
shard is complete and every other file checks out, so the folder is then a packed folder.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Callable, Sequence

from imgpipe._sys.atomic import atomic_write, fsync_dir
from imgpipe._sys.checksum import sha256_file
from imgpipe._sys.pidlock import locked
from imgpipe._sys.regular import read_regular
from imgpipe.cache.checkout import INIT_LOCK_NAME
from imgpipe.cache.nodecache import NodeCache, warn_unwritable
from imgpipe.errors import DatasetError
from imgpipe.format.manifest import MANIFEST_NAME

FetchFiles = Callable[[Sequence[str]], list[bytes]]  # whole files of the upstream folder, by name


def whole_files(cache: NodeCache, names: Sequence[str], fetch: FetchFiles) -> list[bytes]:
    """The files ``names``: from the folder when their sha256 matches the manifest's, else fetched, checked and written there."""
    blobs = _local_files(cache, names)
    if all(blob is not None for blob in blobs):
        return blobs  # type: ignore[return-value]
    with locked(cache.state_dir / INIT_LOCK_NAME):
        missing = [k for k, blob in enumerate(blobs) if blob is None]
        for k, data in zip(missing, _local_files(cache, [names[k] for k in missing])):  # another process may have fetched them meanwhile
            blobs[k] = data
        missing = [k for k, blob in enumerate(blobs) if blob is None]
        if missing:
            for k, data in zip(missing, fetch([names[k] for k in missing])):
                if not _matches(cache, names[k], data):
                    raise DatasetError(f"{cache.url}/{names[k]}: sha256 differs from the manifest; run 'imgpipe verify {cache.url}'")
                blobs[k] = data
                _write_quietly(cache, names[k], data)
    return blobs  # type: ignore[return-value]  (every item is set)


def lacking(cache: NodeCache, names: Sequence[str]) -> list[str]:
    """Those of the files ``names`` that the folder does not hold as the manifest lists them."""
    return [name for name, blob in zip(names, _local_files(cache, names)) if blob is None]


def keep_if_listed(cache: NodeCache, name: str, data: bytes) -> bool:
    """Write ``data`` as the file ``name`` if it is what the manifest lists; False (nothing written) if not."""
    if not _matches(cache, name, data):
        return False
    _write_quietly(cache, name, data)
    return True


def commit(cache: NodeCache) -> bool:
    """Write the manifest, once every shard is complete: every other file is checked against its sha256 and
    fsynced, every shard's size checked, first. False (nothing written) if one is not ready."""
    for name, (_, sha) in cache.files.items():
        path = cache.folder / name
        try:
            if sha256_file(path) != sha:
                path.unlink()
                return False
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        except FileNotFoundError:
            return False
    for split in cache.manifest.splits:
        shards = cache.split(split).shards
        if not cache.completed(split).array.all():
            return False
        for shard in shards:  # each hashed right before it was marked complete; its size says it is still the file that did
            try:
                if os.stat(cache.shard_path(shard.name)).st_size != shard.bytes:
                    return False
            except FileNotFoundError:
                return False
    fsync_dir(cache.folder)
    if not cache.current():
        return False
    atomic_write(cache.folder / MANIFEST_NAME, lambda f: f.write(cache.manifest_bytes))
    return True


def _local_files(cache: NodeCache, names: Sequence[str]) -> list[bytes | None]:
    """The files of the folder whose sha256 matches the manifest; None for the others."""
    blobs: list[bytes | None] = []
    for name in names:
        try:
            data = read_regular(cache.folder / name)
        except OSError:
            data = None
        blobs.append(data if data is not None and _matches(cache, name, data) else None)
    return blobs


def _matches(cache: NodeCache, name: str, data: bytes) -> bool:
    size, sha = cache.files[name]
    return (size is None or len(data) == size) and hashlib.sha256(data).hexdigest() == sha


def _write_quietly(cache: NodeCache, name: str, data: bytes) -> None:
    """Write a whole file atomically, without fsync (its sha256 is checked on every read, and at the commit)."""
    tmp = cache.folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, cache.folder / name)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        warn_unwritable(cache.folder, e)
