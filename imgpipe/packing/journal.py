"""The pack journal in ``DST/.imgpipe-pack/``: what a pack was asked to do and which shards are done.

``plan.json`` holds the pack options and the plan fingerprint. Rule: ``{shard}.json``, written atomically
right after the shard's .rec and .idx were renamed into place, is the only proof that a shard is
finished: a rerun skips exactly the journaled shards and rewrites anything else. Each node writes only
its own entries and holds ``node-{rank}.lock`` (its pid inside) from before it touches DST (even to delete
it for --overwrite) to the end, so two packs never write the same shards; ``parts.json`` records how a
pack in parts is split (``packing.parts``).
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.jsonfile import as_dataclass, read_json
from imgpipe._sys.pidlock import describe_holder, holder_alive, is_held, lock_holder, try_lock
from imgpipe.errors import PackError
from imgpipe.format.manifest import JOURNAL_DIR, PLAN_NAME
from imgpipe.packing.parts import Parts

PARTS_NAME = "parts.json"


@dataclass
class ShardResult:
    """A finished shard as its worker wrote it: checksums, and what happened to each item."""

    name: str
    records: int
    bytes: int
    sha256: str
    index_bytes: int
    index_sha256: str
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (planned position, reason)
    actions: dict[str, int] = field(default_factory=dict)  # kept / repaired / resized -> count
    repairs: dict[str, int] = field(default_factory=dict)  # repair reason -> count
    crc32: list[int] = field(default_factory=list)  # zlib.crc32 of each record, in record order
    source_bytes: int = 0

    @classmethod
    def from_value(cls, value: object) -> "ShardResult":
        """The result ``Journal.write_entry`` wrote, from its decoded JSON; a ValueError for anything else."""
        result = as_dataclass(cls, value)
        counts = (result.records, result.bytes, result.index_bytes, result.source_bytes)
        if min(counts) < 0 or len(result.crc32) != result.records or not all(0 <= crc < 2**32 for crc in result.crc32):
            raise ValueError(f"counts {counts} and {len(result.crc32)} crc32s do not describe a shard")
        result.skipped = [(pos, reason) for pos, reason in result.skipped]
        return result


@dataclass
class StoredPlan:
    """``plan.json``: the pack options, the plan fingerprint and the planned shard count."""

    options: dict[str, Any]
    fingerprint: str
    shards: int | None = None  # None in the journals of packs started before it was recorded


class Journal:
    """Read and write ``DST/.imgpipe-pack``."""

    def __init__(self, dst: Path) -> None:
        self.dst = Path(dst)
        self.folder = self.dst / JOURNAL_DIR

    def read_plan(self) -> StoredPlan | None:
        """What ``write_plan`` recorded, or None before the first plan."""
        fix = "pass --overwrite (or, with --num-nodes, empty DST) to start again"
        try:
            return read_json(self.folder / PLAN_NAME, "pack journal", fix, PackError, into=functools.partial(as_dataclass, StoredPlan))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_plan(self, options: dict[str, Any], fingerprint: str, shards: int) -> None:
        """Record the options, the plan fingerprint and the planned shard count (for 'incomplete pack' messages)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"options": options, "fingerprint": fingerprint, "shards": shards}, indent=1, sort_keys=True) + "\n"
        atomic_write_bytes(self.folder / PLAN_NAME, data.encode("utf-8"))

    def read_parts(self) -> Parts | None:
        """How the first run in several parts split this pack, or None."""
        fix = "delete it once no node of this pack runs, then rerun"
        try:
            return read_json(self.folder / PARTS_NAME, "pack journal", fix, PackError, into=Parts.from_value)
        except (FileNotFoundError, NotADirectoryError):  # not started, or DST is a file (pack says so)
            return None

    def record_parts(self, parts: Parts) -> None:
        """Record a split in several parts unless one is recorded; refuse another split (its runs would write the same shards)."""
        recorded = self.read_parts()
        if recorded is None and parts.count > 1:
            atomic_write_bytes(self.folder / PARTS_NAME, parts.to_json())
            recorded = self.read_parts()  # a node that started at the same moment with another split: one of the two stops
        if recorded is not None and recorded.count != parts.count:
            how = "SLURM array tasks" if recorded.first_id is not None else "--num-nodes"
            raise PackError(
                f"DST {self.dst} is being packed in {recorded.count} parts (by {how}), this run would split it in {parts.count}: "
                f"give --num-nodes {recorded.count} and a --node-rank, or, once no node of that pack runs, "
                f"delete {self.folder / PARTS_NAME} to split what is left another way"
            )

    def entry_path(self, shard_name: str) -> Path:
        return self.folder / f"{shard_name}.json"

    def read_entry(self, shard_name: str) -> ShardResult | None:
        """The journaled result of a shard, or None if it is not finished."""
        fix = "delete it to rewrite that shard"
        try:
            return read_json(self.entry_path(shard_name), "journal entry", fix, PackError, into=ShardResult.from_value)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_entry(self, result: ShardResult) -> None:
        data = json.dumps(vars(result), separators=(",", ":"), sort_keys=True) + "\n"  # asdict's deep copy costs more
        atomic_write_bytes(self.entry_path(result.name), data.encode("utf-8"))

    def lock(self, node_rank: int, *, whole_dst: bool = False, wait_s: float = 30.0) -> int:
        """Take this node's lock and write our pid into it; return the fd to keep open.

        A lock held by a live pack fails at once, naming its pid. A lock whose holder died
        (kill -9) is held on by its pool workers until they notice and exit, so that case is
        waited for (up to ``wait_s``). ``whole_dst`` (for --overwrite) also requires that no
        other node's lock is held.
        """
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PackError(
                f"{self.folder}: cannot make the pack journal there ({e.strerror}); move that file away or choose another DST"
            ) from None
        fd = self._acquire(self.folder / f"node-{node_rank}.lock", wait_s)
        if whole_dst:
            for other in sorted(self.folder.glob("node-*.lock")):
                if other.name != f"node-{node_rank}.lock":
                    try:
                        os.close(self._acquire(other, wait_s))
                    except PackError:
                        os.close(fd)
                        raise
        return fd

    def writer(self, node_rank: int) -> str | None:
        """Who writes node ``node_rank``'s part now (``pid 123``, ``pid 123 on node7``), or None when no process holds its lock."""
        path = self.folder / f"node-{node_rank}.lock"
        return describe_holder(lock_holder(path)) if is_held(path) else None

    def _acquire(self, path: Path, wait_s: float) -> int:
        deadline = time.monotonic() + wait_s
        while True:
            fd = try_lock(path)
            if fd is not None:
                return fd
            holder = lock_holder(path)
            if (holder is not None and holder_alive(*holder)) or time.monotonic() > deadline:
                raise PackError(
                    f"another imgpipe pack is writing {self.dst} ({describe_holder(holder)}); wait for it to finish or stop it, then rerun"
                ) from None
            time.sleep(0.05)
