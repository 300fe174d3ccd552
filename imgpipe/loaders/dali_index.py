"""The single cumulative index that DALI's ``fn.readers.mxnet`` needs for a ShardSet's .rec files.

A function of its own, not a ShardSet method: it writes a file (or reuses one).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe.errors import DatasetError
from imgpipe.format import recordio
from imgpipe.format.shardset import ShardSet, open_shardset

logger = logging.getLogger(__name__)


def write_dali_index(shards: ShardSet | str | os.PathLike | Sequence[str | os.PathLike], split: str = "train") -> Path:
    """One index for all .rec files, offsets running on across them in order, as DALI's mxnet reader needs.

    ``shards``: a ShardSet, or what ``open_shardset`` opens as ``split`` (a packed folder, a .rec
    file, a glob, a list of .rec files); pass DALI the ShardSet's ``rec_paths`` in that order.
    DALI's ``RecordIOLoader::ReadIndexFile`` accepts exactly one index file, sorts its
    offsets and maps each to a file by the cumulative sizes of the ``.rec`` paths in the
    order given. The file is written atomically next to the shards (or under
    ``$XDG_CACHE_HOME/imgpipe`` when that folder is read-only) and reused while the
    shards are unchanged.
    """
    if not isinstance(shards, ShardSet):
        if not isinstance(shards, (str, os.PathLike, list, tuple)):
            raise DatasetError(
                f"shards must be a ShardSet, a packed folder, a .rec file, a glob or a list of .rec files, got {type(shards).__name__}"
            )
        shards = open_shardset(shards, split)
    if not len(shards):
        raise DatasetError(f"split {shards.split!r} has no records: nothing for DALI to read")
    stats = [p.stat() for p in shards.rec_paths]
    empty = next((p for p, st in zip(shards.rec_paths, stats) if st.st_size == 0), None)
    if empty is not None:
        raise DatasetError(f"{empty}: empty shard (no records): DALI cannot map an empty file; remove it and its .idx")
    sizes = np.array([st.st_size for st in stats], dtype=np.int64)
    fingerprint = hashlib.sha256()
    for path, st in zip(shards.rec_paths, stats):
        fingerprint.update(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    tag = fingerprint.hexdigest()[:16]
    prefix = shards.split if shards.packed else shards.rec_paths[0].stem
    name = f"{prefix}.{tag}.dali-index"
    candidates = [shards.rec_paths[0].parent / name, _cache_dir() / name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    shard, start = shards.record_locations()
    offsets = (base[shard] + start).tolist()
    text = "".join(recordio.format_index_line(k, o) for k, o in enumerate(offsets)).encode("ascii")
    for candidate in candidates:
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(candidate, text)
        except OSError as e:
            logger.debug("cannot write the DALI index at %s: %s", candidate, e)
            continue
        if shards.packed and candidate == candidates[0]:  # a packed split: older indexes are stale
            for stale in candidate.parent.glob(f"{prefix}.*.dali-index"):
                if stale != candidate:
                    stale.unlink(missing_ok=True)
        return candidate
    raise DatasetError(f"cannot write a DALI index next to {shards.rec_paths[0]} nor in {candidates[-1].parent}; set XDG_CACHE_HOME")


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "imgpipe"
