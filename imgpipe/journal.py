"""The pack journal in ``DST/.imgpipe-pack/``: what a pack was asked to do and which shards are done.

``plan.json`` holds the pack options and the plan fingerprint. ``{shard}.json`` is written
atomically right after the shard's .rec and .idx have been renamed into place: it is the
only proof that a shard is finished, so a rerun skips exactly the journaled shards and
rewrites anything else. Each node of a multi-node pack writes only its own entries, and
holds ``node-{rank}.lock`` while it runs so that two packs never write the same shards.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgpipe.atomic import atomic_write_bytes
from imgpipe.errors import PackError
from imgpipe.manifest import MANIFEST_NAME, SHARD_FILE

JOURNAL_DIR = ".imgpipe-pack"
PLAN_NAME = "plan.json"


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
    def from_dict(cls, data: dict[str, Any]) -> "ShardResult":
        result = cls(**data)
        result.skipped = [(int(pos), str(reason)) for pos, reason in result.skipped]
        return result


class Journal:
    """Read and write ``DST/.imgpipe-pack``."""

    def __init__(self, dst: Path) -> None:
        self.dst = Path(dst)
        self.folder = self.dst / JOURNAL_DIR

    def exists(self) -> bool:
        return (self.folder / PLAN_NAME).exists()

    def read_plan(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / PLAN_NAME).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise PackError(f"{self.folder / PLAN_NAME}: unreadable pack journal ({e}); pass --overwrite to start again") from None

    def write_plan(self, options: dict[str, Any], fingerprint: str, shards: int) -> None:
        """Record the options, the plan fingerprint and the planned shard count (for 'incomplete pack' messages)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"options": options, "fingerprint": fingerprint, "shards": shards}, indent=1, sort_keys=True) + "\n"
        atomic_write_bytes(self.folder / PLAN_NAME, data.encode("utf-8"))

    def entry_path(self, shard_name: str) -> Path:
        return self.folder / f"{shard_name}.json"

    def read_entry(self, shard_name: str) -> ShardResult | None:
        """The journaled result of a shard, or None if it is not finished."""
        try:
            data = json.loads(self.entry_path(shard_name).read_text(encoding="utf-8"))
            return ShardResult.from_dict(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            raise PackError(
                f"{self.entry_path(shard_name)}: unreadable journal entry ({e}); delete it to rewrite that shard"
            ) from None

    def write_entry(self, result: ShardResult) -> None:
        data = json.dumps(asdict(result), separators=(",", ":"), sort_keys=True) + "\n"
        atomic_write_bytes(self.entry_path(result.name), data.encode("utf-8"))

    def lock(self, node_rank: int, wait_s: float = 60.0) -> int:
        """Take this node's lock (waiting for a killed run's workers to exit); return the fd to keep open."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"node-{node_rank}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise PackError(
                        f"{path}: another 'imgpipe pack' (node {node_rank}) is still writing {self.dst}; "
                        "wait for it to finish or stop it first"
                    ) from None
                time.sleep(0.05)


def unfinished_pack(folder: str | os.PathLike) -> str | None:
    """A one-line 'incomplete pack' message when ``folder`` holds a pack journal but no manifest, else None.

    A folder is complete only when its manifest exists: shards beside a journal are a pack
    that was killed, ran out of disk, is still running, or waits for other nodes.
    """
    folder = Path(folder)
    journal = folder / JOURNAL_DIR
    if (folder / MANIFEST_NAME).exists() or not journal.is_dir():
        return None
    done = sum(1 for p in journal.iterdir() if (m := SHARD_FILE.match(p.name)) and m["ext"] == "json")
    try:
        total = json.loads((journal / PLAN_NAME).read_text(encoding="utf-8")).get("shards")
    except (OSError, ValueError, AttributeError):
        total = None
    rerun = "rerun the same 'imgpipe pack' (with --num-nodes: every --node-rank, then --finalize)"
    if not isinstance(total, int):
        state = f"{done} shard(s) finished, the planned count is unknown"
    elif done < total:
        state = f"{total - done} of {total} shards missing"
    else:
        state = f"all {total} shards written"
    return f"{folder}: incomplete pack: {state}, no {MANIFEST_NAME}; {rerun}"
