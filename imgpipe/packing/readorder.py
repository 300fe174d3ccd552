"""Read a pack's source in the order its storage holds it, with reads in flight.

The plan's shuffled order is the output's, not the reads': files are read by where their data lies
(``plan.source_stats``: FIEMAP's offset, else the inode number; many at a time: ``filereads``), archive
members front to back, streams (``.tar.gz``, Parquet) from their start, a unit per job. Files and
members are cut into jobs of up to ``JOB_ITEMS`` neighbours (the members of many small archives share
a job), handed out front to back, so every worker is busy whatever the shard count and no job is so
small that handing it out costs more than reading it; ``scatter`` puts each record in its slot.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from imgpipe.errors import PackError
from imgpipe.ingest.members import ArchiveFile, MemberSpans, member_reader
from imgpipe.ingest.streams import StreamItems, StreamUnit
from imgpipe.packing.filereads import FileReads, opens_are_round_trips
from imgpipe.packing.plan import PackPlan
from imgpipe.packing.slots import SlotMap

JOB_ITEMS = 256
JOBS_PER_WORKER = 4  # at least, where there are items enough: the last jobs end near together
FILES, MEMBERS, STREAMS = range(3)
Entry = tuple[int, float, int, int, int, int]  # item, label, position (record key), shard, slot offset, slot length


@dataclass(frozen=True)
class MemberReads:
    """Archive members, read in this order (front to back), each checked as ``member_reader`` checks it."""

    spans: MemberSpans
    names: list[str]

    def read(self) -> Iterator[bytes | str]:
        with member_reader(self.spans) as read:
            yield from (read(k, name) for k, name in enumerate(self.names))


@dataclass(frozen=True)
class UnitReads:
    """The members of a stream at the sorted, unique ``ordinals``, in one pass from its start."""

    unit: StreamUnit
    ordinals: np.ndarray
    sizes: np.ndarray  # of each, as listed

    def read(self) -> Iterator[bytes | str]:
        for j, (ordinal, data) in enumerate(self.unit.read(self.ordinals, self.sizes)):
            if ordinal != self.ordinals[j]:  # pragma: no cover - readers yield what was asked, in order
                raise PackError(f"{self.unit}: expected member {self.ordinals[j]}, got {ordinal}")
            yield data


@dataclass(frozen=True)
class ReadJob:
    """Reads in storage order, and for read j the items (with their slots) that take its bytes."""

    reads: FileReads | MemberReads | UnitReads
    what: str  # for messages: what the job reads
    starts: np.ndarray  # read j feeds items[starts[j]:starts[j + 1]]
    items: np.ndarray  # g
    labels: np.ndarray
    positions: np.ndarray
    shards: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    def columns(self) -> list[list]:
        """Per item: g, label, position, shard, slot offset and slot length (the fields of an ``Entry``), as lists."""
        return [self.items.tolist(), self.labels.astype(np.float64).tolist(), self.positions.tolist(), self.shards.tolist(),
                self.offsets.tolist(), self.lengths.tolist()]  # fmt: skip


class ReadOrder:
    """Where each item of a slot map lies (kind, unit, key), and the jobs that read them in that order."""

    def __init__(self, plan: PackPlan, slot_map: SlotMap, root: Path) -> None:
        self.slot_map = slot_map
        self.root = os.path.join(os.fspath(root), "")
        names = list(dict.fromkeys(spec.split for spec in slot_map.shards))
        self.splits = [plan.splits[name] for name in names]
        self.split_of = np.array([names.index(spec.split) for spec in slot_map.shards], np.int32)  # per shard
        archives: dict[ArchiveFile, int] = {}
        units: dict[StreamUnit, int] = {}
        count = len(slot_map)
        self.kind, self.unit, self.key = np.zeros(count, np.int8), np.zeros(count, np.int32), np.zeros(count, np.int64)
        for k, spec in enumerate(slot_map.shards):
            split, items = plan.splits[spec.split], slice(slot_map.starts[k], slot_map.starts[k + 1])
            window = slice(spec.start, spec.stop)
            if isinstance(split.spans, StreamItems):
                remap = np.array([units.setdefault(u, len(units)) for u in split.spans.units], np.int32)
                self.kind[items], self.unit[items], self.key[items] = STREAMS, remap[split.spans.unit[window]], split.spans.ordinals[window]
            elif isinstance(split.spans, MemberSpans):
                remap = np.array([archives.setdefault(a, len(archives)) for a in split.spans.archives], np.int32)
                self.kind[items], self.unit[items], self.key[items] = (
                    MEMBERS,
                    remap[split.spans.archive[window]],
                    split.spans.offsets[window],
                )
            elif split.places is not None:
                self.key[items] = split.places[window]
        self.units, self.archives = list(units), list(archives)
        self.threads = bool(np.any(self.kind == FILES)) and opens_are_round_trips(root)

    def groups(self, todo: np.ndarray, workers: int) -> list[np.ndarray]:
        """The items ``todo`` cut into jobs, each in storage order: streams first (biggest first), then the rest front to back.

        Files come in bands of ``workers`` jobs that take every ``workers``-th file of the band, so
        that the workers read the same stretch of the disk together, file after file; members come
        in runs of neighbours (an archive's readahead follows one reader), archive after archive.
        """
        workers = max(1, workers)
        todo = todo[np.lexsort((todo, self.key[todo], self.unit[todo], self.kind[todo]))]
        runs = np.split(todo, np.flatnonzero(np.diff(self.kind[todo]) | np.diff(self.unit[todo])) + 1) if len(todo) else []
        streams = sorted((run for run in runs if self.kind[run[0]] == STREAMS), key=lambda run: -int(self.slot_map.sizes[run].sum()))
        others = [run for run in runs if self.kind[run[0]] != STREAMS]
        size = max(1, min(JOB_ITEMS, math.ceil(sum(map(len, others)) / (JOBS_PER_WORKER * workers))))
        groups = list(streams)
        for run in others:
            if self.kind[run[0]] == FILES:
                bands = (run[start : start + size * workers] for start in range(0, len(run), size * workers))
                groups += [band[w::workers] for band in bands for w in range(min(workers, len(band)))]
        members = [run for run in others if self.kind[run[0]] == MEMBERS]
        joined = np.concatenate(members) if members else np.zeros(0, np.int64)  # in archive order, each front to back
        return groups + [joined[start : start + size] for start in range(0, len(joined), size)]

    def job(self, group: np.ndarray) -> ReadJob:
        """The job that reads ``group`` (one of ``groups``)."""
        slot_map, kind, first = self.slot_map, int(self.kind[group[0]]), int(group[0])
        starts = np.arange(len(group) + 1)
        if kind == STREAMS:
            ordinals, firsts = np.unique(self.key[group], return_index=True)
            unit = self.units[int(self.unit[first])]
            reads: FileReads | MemberReads | UnitReads = UnitReads(unit, ordinals, slot_map.sizes[group[firsts]])
            starts, what = np.append(firsts, len(group)), str(unit)
        elif kind == MEMBERS:
            reads, what = MemberReads(self._spans(group), self._paths(group)), str(self.archives[int(self.unit[first])])
            others = len(np.unique(self.unit[group])) - 1
            what += f" and {others:,} more archive{'s' if others > 1 else ''}" if others else ""
        else:
            reads = FileReads(self.root, self._paths(group), slot_map.sizes[group], self.threads)
            what = f"{self.root}{reads.paths[0]}" + (f" and {len(group) - 1:,} more files" if len(group) > 1 else "")
        return ReadJob(reads, what, starts, group, slot_map.labels[group], slot_map.positions[group], slot_map.shard[group],
                       slot_map.offsets[group], slot_map.lengths[group])  # fmt: skip

    def _paths(self, group: np.ndarray) -> list[str]:
        splits, positions = self.split_of[self.slot_map.shard[group]].tolist(), self.slot_map.positions[group].tolist()
        return [self.splits[s].paths[p] for s, p in zip(splits, positions)]

    def _spans(self, group: np.ndarray) -> MemberSpans:
        """The spans of ``group``'s members, in its order (a zip holds train and val: they may come from two splits)."""
        splits = self.split_of[self.slot_map.shard[group]]
        picks = [np.flatnonzero(splits == s) for s in np.unique(splits).tolist()]
        joined = MemberSpans.concat([self.splits[int(splits[pick[0]])].spans.take(self.slot_map.positions[group[pick]]) for pick in picks])  # type: ignore[union-attr]
        return joined.take(np.argsort(np.concatenate(picks), kind="stable")) if len(picks) > 1 else joined
