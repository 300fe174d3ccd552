"""Publish the shards whose records are all written: the slot file as the shard, or compacted into it.

When every record fills its slot exactly, as in a pass-through pack of clean JPEGs, the slot
file is the shard: it is hashed, indexed and renamed into place, so each image is written once,
never copied. Otherwise (a repair, a skip, ``--resize``, a record split at a magic word) the
shard is compacted from its slots and the side file into ``DST/.<shard>.rec.tmp``, fsynced and
renamed. Either way the shard is journaled only once its files are in place.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from imgpipe._sys.atomic import atomic_write_bytes, fsync_dir
from imgpipe._sys.checksum import sha256_file
from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.oserrors import NO_SPACE, describe
from imgpipe.errors import PackError
from imgpipe.format.recordio import IndexedRecordWriter, format_index_line
from imgpipe.packing.journal import Journal, ShardResult
from imgpipe.packing.slots import ACTIONS, REPAIRED, SKIPPED, ItemResults, SideFile, SlotMap, tmp_names


class Publisher:
    """Counts the records still to write per shard, and publishes each shard once it has them all."""

    def __init__(self, slot_map: SlotMap, results: ItemResults, side: SideFile, dst: Path, collect: Callable[[ShardResult], None]) -> None:
        self.slot_map, self.results, self.side, self.dst, self.collect = slot_map, results, side, dst, collect
        self.journal = Journal(dst)
        self.remaining = np.diff(slot_map.starts)
        self.finished = np.zeros(len(slot_map.shards), bool)

    def taken(self, items: np.ndarray | list[int]) -> None:
        """``items`` are written (each once)."""
        self.remaining -= np.bincount(self.slot_map.shard[np.asarray(items, np.int64)], minlength=len(self.slot_map.shards))

    def publish_ready(self) -> None:
        """Publish every shard whose records are all written; several at once in threads (sha256 and copies release the GIL)."""
        ready = np.flatnonzero((self.remaining == 0) & ~self.finished).tolist()
        if len(ready) > 1:
            with ThreadPoolExecutor(min(len(ready), available_cpus())) as threads:
                published = list(threads.map(self._publish, ready))
        else:
            published = [self._publish(k) for k in ready]
        for k, result in zip(ready, published):
            self.collect(result)
            self.finished[k] = True

    def _publish(self, k: int) -> ShardResult:
        """Shard k: its slot file as it is when every record filled its slot, else compacted; then journal it."""
        spec, slot_map, r = self.slot_map.shards[k], self.slot_map, self.results
        items = slot_map.items(k)
        kept = [g for g in items if r.action[g] != SKIPPED]
        exact = len(kept) == len(items) and all(r.side[g] < 0 and r.length[g] == slot_map.lengths[g] for g in kept)
        rec_tmp, idx_tmp = tmp_names(self.dst, spec)
        slot = slot_map.slot_file(k)
        try:
            if exact:
                rec_bytes, rec_sha = slot_map.slot_size(k), _sha256_and_sync(slot)
                index = "".join(format_index_line(int(slot_map.positions[g]), int(slot_map.offsets[g])) for g in kept).encode("ascii")
                atomic_write_bytes(idx_tmp, index)
                os.replace(slot, self.dst / spec.rec_name)
                idx_sha, idx_bytes = hashlib.sha256(index).hexdigest(), len(index)
            else:
                with open(slot, "rb") as slots, IndexedRecordWriter(rec_tmp, idx_tmp) as writer:
                    for g in kept:
                        at = int(r.side[g])
                        framed = (
                            self.side.read(int(r.length[g]), at)
                            if at >= 0
                            else os.pread(slots.fileno(), int(r.length[g]), int(slot_map.offsets[g]))
                        )
                        writer.write_framed(int(slot_map.positions[g]), framed)
                    writer.flush_to_disk()
                os.replace(rec_tmp, self.dst / spec.rec_name)
                rec_bytes, rec_sha, idx_sha, idx_bytes = writer.position, writer.rec_sha256, writer.idx_sha256, writer.idx_bytes
            os.replace(idx_tmp, self.dst / spec.idx_name)
            fsync_dir(self.dst)
        except BaseException as e:
            for path in (rec_tmp, idx_tmp):
                path.unlink(missing_ok=True)
            if isinstance(e, Exception):
                raise write_failure(self.dst, f"writing shard {spec.name}", e) from e
            raise
        actions = Counter(ACTIONS[int(r.action[g])] for g in kept)
        repairs = Counter(r.reasons[g] for g in kept if r.action[g] == REPAIRED and g in r.reasons)
        result = ShardResult(
            name=spec.name, records=len(kept), bytes=rec_bytes, sha256=rec_sha, index_bytes=idx_bytes, index_sha256=idx_sha,
            skipped=[(int(slot_map.positions[g]), r.reasons.get(g, "unreadable image")) for g in items if r.action[g] == SKIPPED],
            actions=dict(sorted(actions.items())), repairs=dict(sorted(repairs.items())), crc32=[int(r.crc[g]) for g in kept],
            source_bytes=int(r.read[items.start : items.stop].sum()),
        )  # fmt: skip
        self.journal.write_entry(result)
        slot.unlink(missing_ok=True)
        return result


def write_failure(dst: Path, doing: str, error: BaseException) -> PackError:
    """One line: a full or read-only DST says what to do and that a rerun resumes; anything else names what failed."""
    if isinstance(error, OSError) and (error.errno in NO_SPACE or error.errno == errno.EROFS):
        return PackError(
            f"DST {dst}: {doing} failed: {describe(error, writing=True)}; "
            "then rerun the same command to resume (the records written are kept)"
        )
    return PackError(f"{doing} failed: {type(error).__name__}: {error}")


def _sha256_and_sync(path: Path) -> str:
    """The file's sha256 (``_sys.checksum``'s, read from the disk); then the file made durable."""
    digest = sha256_file(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return digest
