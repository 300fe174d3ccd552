"""A node-local cache folder of one dataset at a URL: what it holds.

The folder becomes the dataset's packed folder as it fills (``manifest.json`` last, once every file is
complete); the cache's own state is kept apart, in ``.imgpipe-cache/`` (docs/format.md). Rule: a
record's presence byte is set only once its checked bytes were written whole, and a shard's complete
byte only once the file, read back from the disk, hashes to the manifest's sha256 and was fsynced;
docs/remote.md ("Why a presence byte per record") says why that stays true through kill -9 and power loss.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from pathlib import Path

import numpy as np

from imgpipe._sys.jsonfile import loads
from imgpipe._sys.oserrors import NO_SPACE, describe
from imgpipe._sys.regular import read_regular
from imgpipe.cache.shared import SharedArray
from imgpipe.format.manifest import MANIFEST_NAME, Manifest, SplitInfo
from imgpipe.format.unfinished import CACHE_STATE_DIR

logger = logging.getLogger(__name__)

STATE_DIR = CACHE_STATE_DIR
SOURCE_NAME = "source.json"
UNWRITABLE_NAME = "unwritable"


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
    """The cache folder of one dataset version: its files, and the node's shared state of each split
    (``checkout.open_cache`` checks it out for a process)."""

    def __init__(self, folder: Path, url: str, manifest_bytes: bytes, manifest: Manifest) -> None:
        self.folder = folder.absolute()
        self.url = url
        self.manifest_bytes = manifest_bytes
        self.manifest = manifest
        self.version = hashlib.sha256(manifest_bytes).hexdigest()
        self.files = manifest_files(manifest)

    @property
    def state_dir(self) -> Path:
        return self.folder / STATE_DIR

    @property
    def complete(self) -> bool:
        """True once the folder is the whole dataset: its manifest exists (written last)."""
        return (self.folder / MANIFEST_NAME).is_file()

    def current(self) -> bool:
        """True while the folder still caches this version."""
        return cached_version(self.folder) == self.version

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

    def allocate_state(self) -> None:
        """Give every state file its blocks now (``OSError`` when the disk has no room even for them)."""
        for split in self.manifest.splits:
            for array in (self.present(split), self.completed(split), self.fill_eta(split)):
                array.allocate()

    def claims_path(self, split: str) -> Path:
        return self.state_dir / f"{split}.claims"

    def shard_path(self, name: str) -> Path:
        return self.folder / name


def cached_version(folder: Path) -> str | None:
    """The version (manifest sha256) the cache folder holds, or None."""
    try:
        return str(loads(read_regular(folder / STATE_DIR / SOURCE_NAME))["manifest_sha256"])
    except (OSError, ValueError, KeyError, TypeError):  # no version, or a state file damaged: the cache starts afresh
        return None


_warned: set[tuple[int, str]] = set()


def warn_unwritable(folder: Path, error: OSError) -> None:
    """Say that the cache cannot be written (a full disk): reads go on from the URL. Once per node: the
    first process to meet a full disk makes ``unwritable`` in the state folder and warns, the others
    (and its later calls) stay quiet; the next open of the cache removes it."""
    key = (os.getpid(), str(folder))
    if key in _warned:
        return
    _warned.add(key)
    if error.errno in NO_SPACE:
        try:
            os.close(os.open(folder / STATE_DIR / UNWRITABLE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return  # another process of the node said so already
        except OSError as e:
            if e.errno == errno.ENOENT:
                return  # the folder is gone (emptied for another version)
    logger.warning("%s: cannot write to cache_dir (%s); reading from the URL without caching", folder, describe(error, writing=True))


def writable_again(folder: Path) -> None:
    """Forget that the folder's disk was full (the cache is opened again: the space was checked)."""
    (folder / STATE_DIR / UNWRITABLE_NAME).unlink(missing_ok=True)
