"""A node-local cache folder of one dataset at a URL: what it holds, which version, who uses it.

The folder becomes the dataset's packed folder as it fills: each shard file at its own name,
records written at their own offsets (``cachesource.CacheSource``, and whole shards fetched in the
background by ``cachefill``), the ``.idx`` files and sidecars whole, checked against the manifest's
sha256. ``manifest.json`` is written last, once every file of every split is complete, so the
folder is then a packed folder like any other (``imgpipe verify DIR``). The cache's own state is
kept apart, in ``.imgpipe-cache/``:

    source.json         the version cached: the sha256 of the upstream manifest (and its URL)
    manifest.json       that manifest's bytes
    lock, init.lock     flock: every process using the cache holds ``lock`` shared; a version
                        change takes it exclusively (no one may use the old one), under ``init.lock``
    boot_id             the boot of the machine that wrote the presence bytes (see below)
    {split}.present     one byte per record: 1 once its checked bytes were written
    {split}.complete    one byte per shard: 1 once the whole file is there and fsynced
    {split}.claims      one lockable byte per shard: the process filling that shard holds it
    {split}.eta         when the background fill of the split is due to end (a float64, Unix time; 0: unknown)

Which byte says a record is present. A record's presence byte is set after its bytes were
checked (length, framing, crc32 from the sidecar) and written at their offset. A process killed
at any moment leaves every byte it wrote in the page cache, so a set byte stays true. A power
loss may keep a presence byte and lose the bytes before it (no fsync per record: that would cost
a disk flush per record), so the first process of a new boot clears the presence of every shard
that is not complete (``boot_id`` in the state folder says which boot wrote them). On top of
that, every read of a record from a shard that is not complete is checked again, as a read from
the URL is, and a record that fails is fetched again and rewritten. A shard's ``complete`` byte
is set only once all its records are present and cover the file (or the file matched its sha256)
and the file was fsynced, so it never promises more than the disk holds; a complete shard is read
as a local folder is, unchecked. A pack without the crc32 sidecar is cached in whole shards, each
checked against its sha256.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from imgpipe._sys.atomic import atomic_write, atomic_write_bytes, fsync_dir
from imgpipe._sys.diskinfo import format_bytes, free_bytes
from imgpipe._sys.oserrors import describe
from imgpipe.errors import ConfigError, DatasetError
from imgpipe.format.manifest import MANIFEST_NAME, Manifest, SplitInfo, parse_manifest
from imgpipe.storage.source import ByteSource

logger = logging.getLogger(__name__)

STATE_DIR = ".imgpipe-cache"
SOURCE_NAME = "source.json"
BOOT_NAME = "boot_id"
_LOCK, _INIT_LOCK = "lock", "init.lock"
GUESSED_FILL_BYTES_PER_S = 250e6  # a node's fill rate, until the filler measures its own

FetchFiles = Callable[[Sequence[str]], list[bytes]]  # whole files of the upstream folder, by name

_leases: dict[tuple[int, str], int] = {}  # (process, folder) -> the descriptor holding ``lock`` shared
_leases_lock = threading.Lock()


def manifest_files(manifest: Manifest) -> dict[str, tuple[int | None, str]]:
    """Every file of the dataset except its shards, by name: (size if the manifest says it, sha256)."""
    files: dict[str, tuple[int | None, str]] = {}
    for split in manifest.splits.values():
        for shard in split.shards:
            files[shard.index] = (shard.index_bytes, shard.index_sha256)
        files[split.labels] = (None, split.labels_sha256)
        files[split.sources] = (None, split.sources_sha256)
        if split.checksums:
            files[split.checksums] = (None, split.checksums_sha256)
        if split.index_sidecar:
            files[split.index_sidecar] = (None, split.index_sidecar_sha256)
    return files


class NodeCache:
    """The cache folder of one dataset version; ``open`` checks it out for this process."""

    def __init__(self, folder: Path, url: str, manifest_bytes: bytes, manifest: Manifest) -> None:
        self.folder = folder.absolute()
        self.url = url
        self.manifest_bytes = manifest_bytes
        self.manifest = manifest
        self.version = hashlib.sha256(manifest_bytes).hexdigest()
        self.files = manifest_files(manifest)

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, folder: str | os.PathLike, upstream: ByteSource, manifest_bytes: bytes, manifest: Manifest) -> NodeCache:
        """The cache in ``folder`` of the dataset whose manifest is ``manifest_bytes``, held by this process.

        A new or empty folder becomes the cache; a cache of another version of the dataset is
        emptied and started afresh (a warning says so), unless another process still uses it
        (one ``DatasetError`` line); any other non-empty folder is refused. Fails up front when
        the folder's disk cannot hold the rest of the dataset.
        """
        cache = cls(Path(folder), upstream.location, manifest_bytes, manifest)
        state = cache.state_dir
        try:
            if cache.folder.is_dir() and not state.is_dir() and any(cache.folder.iterdir()):
                raise ConfigError(
                    f"{cache.folder}: cache_dir holds files and is no imgpipe cache (no {STATE_DIR}/ in it); give an empty or new folder"
                )
            state.mkdir(parents=True, exist_ok=True)
            with _Flock(state / _INIT_LOCK):
                cache._check_out()
        except OSError as e:
            raise DatasetError(f"{cache.folder}: cannot use as cache_dir: {describe(e, writing=True)}") from None
        cache.check_space()
        return cache

    @property
    def state_dir(self) -> Path:
        return self.folder / STATE_DIR

    @property
    def complete(self) -> bool:
        """True once the folder is the whole dataset: its manifest exists (written last)."""
        return (self.folder / MANIFEST_NAME).is_file()

    def _check_out(self) -> None:
        """Under ``init.lock``: take this version's lease, (re)initialising the folder when it holds another."""
        key = (os.getpid(), str(self.folder.resolve()))
        if self._cached_version() == self.version:
            with _leases_lock:
                if key not in _leases:
                    _leases[key] = _lock_file(self.state_dir / _LOCK, fcntl.LOCK_SH)
            self._forget_other_boots()
            return
        with _leases_lock:
            ours = _leases.pop(key, None)
        if ours is not None:  # this process used the old version: it moves on
            os.close(ours)
        fd = _lock_file(self.state_dir / _LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            raise DatasetError(
                f"{self.folder}: cache_dir holds another version of {self.url} (its manifest changed) and another process still "
                "reads it; wait for that run to end, or give this one another cache_dir"
            )
        old = self._cached_version()
        if old is not None:
            logger.warning(
                "%s: the dataset at %s changed since it was cached (its manifest differs): starting the cache afresh", self.folder, self.url
            )
        self._empty()
        atomic_write_bytes(self.state_dir / MANIFEST_NAME, self.manifest_bytes)
        atomic_write_bytes(self.state_dir / BOOT_NAME, boot_id().encode())
        atomic_write_bytes(self.state_dir / SOURCE_NAME, json.dumps({"url": self.url, "manifest_sha256": self.version}).encode())
        fcntl.flock(fd, fcntl.LOCK_SH)
        with _leases_lock:
            _leases[key] = fd

    def _forget_other_boots(self) -> None:
        """Clear the presence bytes a previous boot wrote (a power loss may have kept them and lost
        their records); complete shards were fsynced and keep theirs."""
        try:
            written = (self.state_dir / BOOT_NAME).read_text()
        except OSError:
            written = ""
        if written == boot_id():
            return
        for split in self.manifest.splits:
            present, complete = self.present(split).array, self.completed(split).array
            first = np.concatenate([[0], np.cumsum([s.records for s in self.split(split).shards])])
            for s in np.flatnonzero(complete == 0).tolist():
                present[first[s] : first[s + 1]] = 0
        atomic_write_bytes(self.state_dir / BOOT_NAME, boot_id().encode())

    def _cached_version(self) -> str | None:
        try:
            return str(json.loads((self.state_dir / SOURCE_NAME).read_bytes())["manifest_sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _empty(self) -> None:
        """Remove every file of the cached dataset and of its state (not the locks)."""
        (self.state_dir / SOURCE_NAME).unlink(missing_ok=True)  # first: a folder half emptied is no version
        (self.folder / MANIFEST_NAME).unlink(missing_ok=True)
        for folder in (self.folder, self.state_dir):
            for path in folder.iterdir():
                if path.is_file() and path.name not in (_LOCK, _INIT_LOCK):
                    path.unlink()

    def check_space(self) -> None:
        """A ``DatasetError`` when the folder's disk cannot hold what the dataset still needs."""
        total = allocated = 0
        names = [shard.name for split in self.manifest.splits.values() for shard in split.shards]
        sizes = [shard.bytes for split in self.manifest.splits.values() for shard in split.shards]
        for name, size in [*zip(names, sizes), *((n, s) for n, (s, _) in self.files.items())]:
            size = size if size is not None else 0
            total += size
            try:
                allocated += min(size, os.stat(self.folder / name).st_blocks * 512)
            except OSError:
                pass
        needed, free = total - allocated, free_bytes(self.folder)
        if needed > free:
            raise DatasetError(
                f"{self.folder}: cache_dir needs {format_bytes(needed)} more for {self.url} ({format_bytes(total)} in all) but its disk has "
                f"{format_bytes(free)} free; free some space, give another cache_dir, or read the URL without one"
            )

    @classmethod
    def attach(cls, folder: str | os.PathLike) -> NodeCache | None:
        """The cache a process of this node opened in ``folder`` (for its background filler), or None if it is gone."""
        state = Path(folder) / STATE_DIR
        try:
            source = json.loads((state / SOURCE_NAME).read_bytes())
            manifest_bytes = (state / MANIFEST_NAME).read_bytes()
        except (OSError, ValueError):
            return None
        cache = cls(Path(folder), str(source.get("url", "")), manifest_bytes, parse_manifest(manifest_bytes, state / MANIFEST_NAME))
        return cache if cache.version == source.get("manifest_sha256") else None

    def current(self) -> bool:
        """True while the folder still caches this version."""
        return self._cached_version() == self.version

    # ------------------------------------------------------------------ whole files

    def whole_files(self, names: Sequence[str], fetch: FetchFiles) -> list[bytes]:
        """The files ``names`` (index files and sidecars): from the folder when their sha256 matches
        the manifest's, else fetched, checked and written there. Files are fetched by one process at
        a time, so the ranks of a node that open the dataset together fetch its index once."""
        blobs = self._local_files(names)
        if all(blob is not None for blob in blobs):
            return blobs  # type: ignore[return-value]
        with _Flock(self.state_dir / _INIT_LOCK):
            missing = [k for k, blob in enumerate(blobs) if blob is None]
            for k, data in zip(missing, self._local_files([names[k] for k in missing])):  # another process may have fetched them meanwhile
                blobs[k] = data
            self._fetch_files(names, blobs, fetch)
        return blobs  # type: ignore[return-value]  (every item is set)

    def lacking(self, names: Sequence[str]) -> list[str]:
        """Those of the files ``names`` that the folder does not hold as the manifest lists them."""
        return [name for name, blob in zip(names, self._local_files(names)) if blob is None]

    def keep_if_listed(self, name: str, data: bytes) -> bool:
        """Write ``data`` as the file ``name`` if it is what the manifest lists; False (nothing written) if not."""
        if not self._matches(name, data):
            return False
        self._write_quietly(name, data)
        return True

    def _local_files(self, names: Sequence[str]) -> list[bytes | None]:
        """The files of the folder whose sha256 matches the manifest; None for the others."""
        blobs: list[bytes | None] = []
        for name in names:
            try:
                data = (self.folder / name).read_bytes()
            except OSError:
                data = None
            blobs.append(data if data is not None and self._matches(name, data) else None)
        return blobs

    def _fetch_files(self, names: Sequence[str], blobs: list[bytes | None], fetch: FetchFiles) -> None:
        missing = [k for k, blob in enumerate(blobs) if blob is None]
        if missing:
            for k, data in zip(missing, fetch([names[k] for k in missing])):
                if not self._matches(names[k], data):
                    raise DatasetError(f"{self.url}/{names[k]}: sha256 differs from the manifest; run 'imgpipe verify {self.url}'")
                blobs[k] = data
                self._write_quietly(names[k], data)

    def _matches(self, name: str, data: bytes) -> bool:
        size, sha = self.files[name]
        return (size is None or len(data) == size) and hashlib.sha256(data).hexdigest() == sha

    def _write_quietly(self, name: str, data: bytes) -> None:
        """Write a whole file atomically, without fsync (its sha256 is checked on every read, and at the commit)."""
        tmp = self.folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self.folder / name)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            warn_unwritable(self.folder, e)

    def commit(self) -> bool:
        """Write the manifest, once every shard is complete: check and fsync every other file first. False if one is not ready."""
        for name, (_, sha) in self.files.items():
            path = self.folder / name
            try:
                with open(path, "rb") as f:
                    if hashlib.file_digest(f, "sha256").hexdigest() != sha:
                        path.unlink()
                        return False
                    os.fsync(f.fileno())
            except FileNotFoundError:
                return False
        fsync_dir(self.folder)
        if not self.current():
            return False
        atomic_write(self.folder / MANIFEST_NAME, lambda f: f.write(self.manifest_bytes))
        return True

    def start_filling(self, split: str, upstream: ByteSource) -> None:
        """Have this process's store helper fetch the rest of the dataset into the folder, ``split`` first
        (``cachefill``); until the filler has measured its rate, its end is guessed at ``GUESSED_FILL_BYTES_PER_S``."""
        from imgpipe.storage.store_helper import HelperClient

        eta, info = self.fill_eta(split).array, self.split(split)
        if eta[0] < time.time():
            done = self.completed(split).array
            left = sum(shard.bytes for shard, whole in zip(info.shards, done) if not whole)
            eta[0] = time.time() + left / GUESSED_FILL_BYTES_PER_S
        HelperClient.shared(getattr(upstream, "budget_s", 30.0)).start("imgpipe.cache.fill:start", self.url, str(self.folder), split)

    # ------------------------------------------------------------------ state

    def split(self, name: str) -> SplitInfo:
        return self.manifest.splits[name]

    def present(self, split: str) -> SharedArray:
        """The presence byte of every record of ``split``."""
        return SharedArray(self.state_dir / f"{split}.present", self.split(split).records)

    def completed(self, split: str) -> SharedArray:
        """The complete byte of every shard of ``split``."""
        return SharedArray(self.state_dir / f"{split}.complete", len(self.split(split).shards))

    def fill_eta(self, split: str) -> SharedArray:
        """When the background fill of ``split`` is due to end (Unix time; 0: unknown)."""
        return SharedArray(self.state_dir / f"{split}.eta", 1, np.float64)

    def claims_path(self, split: str) -> Path:
        return self.state_dir / f"{split}.claims"

    def shard_path(self, name: str) -> Path:
        return self.folder / name


class SharedArray:
    """A small array in a file every process of the node maps (``MAP_SHARED``): a store is seen by
    the others at once. Mapped lazily in each process; pickles without the mapping."""

    def __init__(self, path: Path, size: int, dtype: type = np.uint8) -> None:
        self.path = path
        self.size = size
        self.dtype = np.dtype(dtype)
        self._pid: int | None = None
        self._array: np.ndarray = np.zeros(0, self.dtype)

    @property
    def array(self) -> np.ndarray:
        """A writable array over the shared mapping (zeros where nothing was stored yet)."""
        if self._pid != os.getpid():
            self._open()
        return self._array

    def _open(self) -> None:
        nbytes = self.size * self.dtype.itemsize
        if nbytes == 0:
            self._array, self._pid = np.zeros(0, self.dtype), os.getpid()
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < nbytes:
                os.ftruncate(fd, nbytes)  # never shrinks: every process asks for the same size
            mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._array = np.frombuffer(mapping, self.dtype)
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "dtype": self.dtype, "_pid": None, "_array": np.zeros(0, self.dtype)}


class _Flock:
    """An exclusive flock on a file, for a ``with`` block."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def boot_id() -> str:
    """This boot of the machine (Linux's ``boot_id``): page-cache writes of an earlier one may be lost."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"  # no boot id: presence bytes are never cleared, so a shard is completed by its sha256 only


def _lock_file(path: Path, how: int) -> int | None:
    """A descriptor of ``path`` holding ``flock(how)``; None when a non-blocking lock is refused."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, how)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


_warned: set[tuple[int, str]] = set()


def warn_unwritable(folder: Path, error: OSError) -> None:
    """Say once per process that the cache cannot be written (a full disk): reads go on from the URL."""
    key = (os.getpid(), str(folder))
    if key in _warned:
        return
    _warned.add(key)
    logger.warning("%s: cannot write to cache_dir (%s); reading from the URL without caching", folder, describe(error, writing=True))
