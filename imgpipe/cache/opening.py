"""Open a split wherever it lives: a local folder, a URL, or a URL through a node-local cache."""

from __future__ import annotations

import os
from functools import partial
from typing import Sequence

import numpy as np

from imgpipe.cache.checkout import open_cache
from imgpipe.cache.files import whole_files
from imgpipe.cache.fill import start_filling
from imgpipe.cache.source import CacheSource
from imgpipe.errors import ConfigError
from imgpipe.format.manifest import fetch_manifest
from imgpipe.format.shardset import PathLike, ShardSet, open_packed, open_shardset, open_url
from imgpipe.storage.opening import open_source
from imgpipe.storage.source import ByteSource, is_url


def open_shards(path: PathLike | Sequence[PathLike], split: str = "train", *, cache_dir: PathLike | None = None) -> ShardSet:
    """``format.shardset.open_shardset``, and with ``cache_dir`` (a node-local folder) a URL read through a
    cache that fills as it is read and becomes the URL's packed folder (``imgpipe.cache.nodecache``)."""
    if cache_dir is None:
        return open_shardset(path, split)
    if not isinstance(cache_dir, (str, os.PathLike)) or is_url(cache_dir):
        raise ConfigError(f"cache_dir must be a local folder, got {cache_dir!r}")
    if not is_url(path):
        raise ConfigError(f"cache_dir caches a dataset read from a URL; {path} is read where it is (copy a folder with 'imgpipe stage')")
    source = open_source(path)  # type: ignore[arg-type]
    manifest_bytes, manifest = fetch_manifest(source)
    cache = open_cache(cache_dir, source, manifest_bytes, manifest)
    if cache.complete:
        return open_packed(cache.folder, split)

    def reader(offsets: np.ndarray, ends: np.ndarray, checksums: np.ndarray | None) -> ByteSource:
        records = CacheSource(source, cache, split, offsets, ends, checksums)
        start_filling(cache, split, source)
        return records

    return open_url(
        source, split, fetched=(manifest_bytes, manifest), read_files=partial(whole_files, cache, fetch=source.read_files), reader=reader
    )
