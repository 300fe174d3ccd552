"""Resume a pack killed at any moment: which records are written, in a progress file beside the journal.

Every ``every_s`` seconds (``--checkpoint-every``; 0: whenever results arrive) the parent fsyncs the slot
files and the side file, then atomically writes the progress file, ``.imgpipe-pack/checkpoint-node<rank>.npz``
(the pack's checkpoint, in cli.md's words): per record written its shard, position, action, framed length,
crc32, side-file offset and source bytes, and how much of the side file is valid; a rerun of the same plan
reads only the other records. Nothing in the file is trusted: a record outside its shard or its slot, or a
slot file laid out again, drops what it says.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
import zipfile
from pathlib import Path

import numpy as np

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.jsonfile import loads
from imgpipe._sys.regular import open_regular
from imgpipe.packing.slots import ACTIONS, ItemResults, SideFile, SlotMap

logger = logging.getLogger(__name__)

CHECKPOINT_S = 30.0
ARRAYS = ("shard", "position", "action", "length", "crc", "side", "read")


def progress_path(journal_folder: Path, node_rank: int) -> Path:
    return journal_folder / f"checkpoint-node{node_rank}.npz"


class ProgressFile:
    """Save and load the written records of the slot map's items (``results``) for one node."""

    def __init__(self, path: Path, fingerprint: str, slot_map: SlotMap, results: ItemResults, side: SideFile, every_s: float) -> None:
        self.path, self.fingerprint, self.slot_map, self.results, self.side = path, fingerprint, slot_map, results, side
        self.every_s = every_s
        self.last = time.monotonic()
        self.recorded = False  # results taken since the last save

    def due(self) -> bool:
        return self.recorded and time.monotonic() - self.last >= self.every_s

    def save(self, finished: np.ndarray) -> None:
        """Make every written slot of the unfinished shards durable, then record which records are written."""
        for k in np.flatnonzero(~finished).tolist():
            try:
                fd = os.open(self.slot_map.slot_file(k), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.side.sync()
        r, slot_map = self.results, self.slot_map
        done = np.flatnonzero(r.done)
        reasons = {str(j): r.reasons[g] for j, g in enumerate(done.tolist()) if g in r.reasons}
        meta = {
            "fingerprint": self.fingerprint,
            "side_bytes": self.side.size,
            "shards": [s.name for s in slot_map.shards],
            "reasons": reasons,
        }
        buffer = io.BytesIO()
        saved = dict(
            shard=slot_map.shard, position=slot_map.positions, action=r.action, length=r.length, crc=r.crc, side=r.side, read=r.read
        )
        np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **{name: array[done] for name, array in saved.items()})
        atomic_write_bytes(self.path, buffer.getvalue())
        self.last, self.recorded = time.monotonic(), False

    def save_on_the_way_out(self, finished: np.ndarray) -> None:
        """After a failure: keep what was written for the rerun, if the disk still lets us."""
        if not self.recorded:
            return
        try:
            self.save(finished)
        except OSError as e:
            logger.warning("%s: could not write the checkpoint (%s); the rerun reads those records again", self.path, e)

    def load(self, fresh: np.ndarray) -> np.ndarray:
        """Take the records a killed run wrote (none in the shards whose slot files are ``fresh``); the items taken."""
        taken = np.zeros(0, np.int64)
        try:
            with open_regular(self.path) as f, np.load(f, allow_pickle=False) as data:
                meta = loads(data["meta"].tobytes())
                arrays = {name: data[name] for name in ARRAYS}
            if meta.get("fingerprint") == self.fingerprint:
                taken = self._take(meta, arrays, fresh)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, EOFError, zipfile.BadZipFile) as e:  # EOFError: empty
            logger.warning("%s: unreadable checkpoint (%s); reading every record again", self.path, e)
            taken = np.zeros(0, np.int64)
            self.results.done[:] = False
            self.results.reasons.clear()
        if len(taken):
            logger.info("resuming: %d of %d records were written before; reading the rest", len(taken), len(self.slot_map))
        else:
            self.side.keep(0)
        return taken

    def _take(self, meta: dict, arrays: dict[str, np.ndarray], fresh: np.ndarray) -> np.ndarray:
        slot_map, r = self.slot_map, self.results
        side_bytes = int(meta["side_bytes"])
        here = {spec.name: k for k, spec in enumerate(slot_map.shards)}
        names = [str(name) for name in meta["shards"]]
        shard_map = np.array([here.get(name, -1) for name in names] + [-1], np.int64)
        saved = arrays["shard"].astype(np.int64)
        if len(saved) and (saved.min() < 0 or saved.max() >= len(names)):
            raise ValueError("a record of an unknown shard")
        k = shard_map[saved]
        keep = np.flatnonzero(k >= 0)
        keep = keep[~fresh[k[keep]]]
        k = k[keep]
        first = np.array([spec.start for spec in slot_map.shards], np.int64)
        count = np.diff(slot_map.starts)
        at = arrays["position"][keep].astype(np.int64) - first[k]
        if np.any((at < 0) | (at >= count[k])):
            raise ValueError("a record outside its shard")
        g = slot_map.starts[k] + at
        length, side = arrays["length"][keep].astype(np.int64), arrays["side"][keep].astype(np.int64)
        action = arrays["action"][keep].astype(np.int8)
        in_slot = (side < 0) & (length <= slot_map.lengths[g])
        in_side = (side >= 0) & (side + length <= side_bytes)
        if len(np.unique(g)) != len(g) or np.any(~(in_slot | in_side) | (length < 0)) or np.any((action < 0) | (action >= len(ACTIONS))):
            raise ValueError("a record outside its slot or the side file")
        if side_bytes > os.fstat(self.side.fd).st_size:
            raise ValueError("the side file is shorter than the checkpoint says")
        r.done[g], r.action[g], r.length[g], r.side[g] = True, action, length, side
        r.crc[g], r.read[g] = arrays["crc"][keep].astype(np.uint32), arrays["read"][keep].astype(np.int64)
        saved_reasons = meta["reasons"]
        for j, g_item in zip(keep.tolist(), g.tolist()):
            text = saved_reasons.get(str(j))
            if text:
                r.reasons[g_item] = str(text)
        self.side.keep(side_bytes)
        return g
