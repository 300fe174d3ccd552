"""The slots a pack writes records into, laid out before anything is read.

The plan's shuffled order gives every shard records from all over the source, so no shard can be
written front to back while the source is read in storage order. Each shard to write gets a sparse slot
file, ``.imgpipe-pack/slots/<shard>.rec``, one slot per record in record order, as long as the framed
record its source bytes make when kept as they are; workers write each record into its slot, and a
record longer than its slot (a repair, a record split at a magic word) waits in the parent's side file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from imgpipe.format.recordio import FRAME_HEADER, IR_SIZE
from imgpipe.packing.journal import Journal
from imgpipe.packing.plan import PackPlan, ShardSpec

SLOTS_DIR = "slots"
ACTIONS = ("kept", "repaired", "resized", "skipped")
REPAIRED, SKIPPED = ACTIONS.index("repaired"), ACTIONS.index("skipped")


def slot_lengths(sizes: np.ndarray) -> np.ndarray:
    """The framed length of each record whose image is ``sizes`` bytes, kept as it is (no magic-word split)."""
    length = IR_SIZE + sizes.astype(np.int64)
    return FRAME_HEADER.size + length + (-length & 3)


def tmp_names(dst: Path, spec: ShardSpec) -> tuple[Path, Path]:
    """The temporary .rec and .idx paths of a shard being published."""
    return dst / f".{spec.rec_name}.tmp", dst / f".{spec.idx_name}.tmp"


@dataclass
class SlotMap:
    """The items of the shards to write, shard after shard in record order (item g = 0..G-1), and their slots."""

    shards: list[ShardSpec]
    starts: np.ndarray  # int64: shard k holds items starts[k]:starts[k + 1]
    positions: np.ndarray  # int64: the record key (position in the split's planned order)
    labels: np.ndarray  # int32
    sizes: np.ndarray  # int64: source bytes, as planned
    offsets: np.ndarray  # int64: slot offset in the shard's slot file
    lengths: np.ndarray  # int64: slot length
    shard: np.ndarray  # int32: the shard (index into shards) of each item
    folder: Path

    @classmethod
    def of(cls, plan: PackPlan, todo: Sequence[ShardSpec], folder: Path) -> "SlotMap":
        windows = [(plan.splits[spec.split], slice(spec.start, spec.stop)) for spec in todo]
        join = lambda arrays, dtype: np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)  # noqa: E731
        sizes = join([split.sizes[window] for split, window in windows], np.int64)
        lengths = slot_lengths(sizes)
        starts = np.concatenate([[0], np.cumsum([spec.items for spec in todo], dtype=np.int64)]).astype(np.int64)
        shard = np.repeat(np.arange(len(todo), dtype=np.int32), np.diff(starts))
        ends = np.cumsum(lengths)
        offsets = ends - lengths - np.concatenate([[0], ends])[starts[:-1]][shard]  # restarted at each shard's first item
        return cls(
            list(todo), starts, join([np.arange(spec.start, spec.stop) for spec in todo], np.int64),
            join([split.labels[window] for split, window in windows], np.int32), sizes, offsets.astype(np.int64), lengths, shard, folder,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.positions)

    def items(self, k: int) -> range:
        return range(int(self.starts[k]), int(self.starts[k + 1]))

    def slot_file(self, k: int) -> Path:
        return self.folder / self.shards[k].rec_name

    def slot_files(self) -> list[Path]:
        return [self.slot_file(k) for k in range(len(self.shards))]

    def slot_size(self, k: int) -> int:
        return int(self.lengths[self.starts[k] : self.starts[k + 1]].sum())

    def make_slot_files(self, journal: Journal) -> np.ndarray:
        """A sparse slot file per shard, of its slots' size; which of them are new (no record written yet).

        Slot files of journaled shards (a kill after the journal entry) go.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in self.folder.glob("*.rec"):
            if journal.read_entry(stale.name[: -len(".rec")]) is not None:
                stale.unlink()
        fresh = np.zeros(len(self.shards), bool)
        for k in range(len(self.shards)):
            path, size = self.slot_file(k), self.slot_size(k)
            if path.exists() and path.stat().st_size == size:
                continue
            with open(path, "wb") as f:
                f.truncate(size)
            fresh[k] = True
        return fresh

    def remove(self) -> None:
        for k in range(len(self.shards)):
            self.slot_file(k).unlink(missing_ok=True)


@dataclass
class ItemResults:
    """What is known of each item: done, action, framed length, crc32, side-file offset (-1: in its slot), source bytes, reason."""

    done: np.ndarray
    action: np.ndarray
    length: np.ndarray
    crc: np.ndarray
    side: np.ndarray
    read: np.ndarray
    reasons: dict[int, str]

    @classmethod
    def empty(cls, count: int) -> "ItemResults":
        return cls(np.zeros(count, bool), np.zeros(count, np.int8), np.zeros(count, np.int64), np.zeros(count, np.uint32),
                   np.full(count, -1, np.int64), np.zeros(count, np.int64), {})  # fmt: skip


class SideFile:
    """Where the parent keeps records longer than their slots, appended; ``size`` bytes of it are valid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = 0

    def append(self, data: bytes) -> int:
        """Write ``data`` at the end; its offset."""
        offset, view = self.size, memoryview(data)
        while view:
            count = os.pwrite(self.fd, view, self.size)
            view, self.size = view[count:], self.size + count
        return offset

    def keep(self, size: int) -> None:
        """Keep the first ``size`` bytes (those the progress file holds), drop the rest."""
        os.ftruncate(self.fd, size)
        self.size = size

    def read(self, count: int, offset: int) -> bytes:
        return os.pread(self.fd, count, offset)

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
