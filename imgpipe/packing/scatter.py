"""Write shards from stream sources (``streams``): each unit is read once, from its start, and every
record goes straight to its planned place in its shard.

The plan orders a split by the extracted tree (shuffled), so every shard takes records from
every unit and none can be written front to back while units are read in their own order.
Each shard is laid out before reading: one slot per record, as long as the record its source
bytes make when kept as they are, in a sparse file ``.imgpipe-pack/slots/<shard>.rec``.
Workers read whole units (a ``.tar.gz``, a Parquet row group), prepare each wanted member
and write its framed record into its slot. When every record of a shard fills its slot
exactly, as in a pass-through pack of clean JPEGs, the slot file is the shard: it is
checksummed, indexed and renamed into place, so the images are written once, never copied.
Otherwise (a repair, a skip, ``--resize``, a record split at a magic word) the shard is
compacted into place from its slots; a record longer than its slot waits in a side file the
parent writes.

Resume: every ``IMGPIPE_PACK_CHECKPOINT_S`` seconds (default 30; 0: whenever results
arrive) the parent fsyncs the slot files and then writes ``.imgpipe-pack/stream-node<rank>.npz``:
which records are written, their lengths, crc32s and what was done to each. A rerun after
kill -9 keeps them, reads each unit only up to its last record not written, and skips units
that are done.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import queue as queue_module
import signal
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from imgpipe._sys.atomic import atomic_write_bytes, fsync_dir
from imgpipe._sys.checksum import crc32, sha256_file
from imgpipe._sys.distenv import available_cpus
from imgpipe._sys.oserrors import NO_SPACE, describe
from imgpipe._sys.procs import die_with_parent, pool_context
from imgpipe.errors import ImgpipeError, PackError
from imgpipe.format.recordio import FRAME_HEADER, IR_SIZE, IndexedRecordWriter, IRHeader, format_index_line, frame_parts, pack_header
from imgpipe.image import codec
from imgpipe.ingest.streams import StreamItems, StreamUnit
from imgpipe.packing.journal import Journal, ShardResult
from imgpipe.packing.plan import PackPlan, ShardSpec
from imgpipe.packing.shardwriter import tmp_names

logger = logging.getLogger(__name__)

CHECKPOINT_ENV = "IMGPIPE_PACK_CHECKPOINT_S"
CHECKPOINT_S = 30.0
SLOTS_DIR = "slots"
ACTIONS = ("kept", "repaired", "resized", "skipped")
SKIPPED = ACTIONS.index("skipped")
REPORT_EVERY_S = 0.2
RESULTS_TIMEOUT_S = 60.0
MAX_OPEN_SLOTS = 256  # slot files a worker keeps open (a unit feeds every shard)
Emit = Callable[[list[tuple[int, int, str | None, int, int, bytes | None, int]]], None]
_Entry = tuple[int, float, int, int, int, int]  # item, label, position (record key), shard, slot offset, slot length


def slot_lengths(sizes: np.ndarray) -> np.ndarray:
    """The framed length of each record whose image is ``sizes`` bytes, kept as it is (no magic-word split)."""
    length = IR_SIZE + sizes.astype(np.int64)
    return FRAME_HEADER.size + length + (-length & 3)


@dataclass
class _Layout:
    """The items of the shards to write, shard after shard in position order (item g = 0..G-1)."""

    shards: list[ShardSpec]
    starts: np.ndarray  # shard k holds items starts[k]:starts[k + 1]
    splits: list[str]  # split of each shard
    positions: np.ndarray  # int64: the record key
    labels: np.ndarray  # int32
    units: list[StreamUnit]
    unit: np.ndarray  # int32, into units
    ordinals: np.ndarray  # int64
    sizes: np.ndarray  # int64
    offsets: np.ndarray  # int64: slot offset in the shard's slot file
    lengths: np.ndarray  # int64: slot length

    @classmethod
    def of(cls, plan: PackPlan, todo: Sequence[ShardSpec]) -> "_Layout":
        units: dict[StreamUnit, int] = {}
        parts: dict[str, list[np.ndarray]] = {name: [] for name in ("positions", "labels", "unit", "ordinals", "sizes", "offsets")}
        starts = [0]
        for spec in todo:
            split = plan.splits[spec.split]
            items = split.spans.take(slice(spec.start, spec.stop))  # type: ignore[union-attr]
            assert isinstance(items, StreamItems)
            remap = np.array([units.setdefault(u, len(units)) for u in items.units], np.int32)
            lengths = slot_lengths(items.sizes)
            parts["positions"].append(np.arange(spec.start, spec.stop, dtype=np.int64))
            parts["labels"].append(split.labels[spec.start : spec.stop])
            parts["unit"].append(remap[items.unit] if len(items.unit) else items.unit)
            parts["ordinals"].append(items.ordinals)
            parts["sizes"].append(items.sizes)
            parts["offsets"].append(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths)
            starts.append(starts[-1] + spec.items)
        joined = {name: np.concatenate(arrays) for name, arrays in parts.items()}
        lengths = slot_lengths(joined["sizes"])
        return cls(list(todo), np.array(starts, np.int64), [s.split for s in todo], joined["positions"], joined["labels"],
                   list(units), joined["unit"], joined["ordinals"], joined["sizes"], joined["offsets"], lengths)  # fmt: skip

    @property
    def shard(self) -> np.ndarray:
        """The shard (index into ``shards``) of each item."""
        return np.repeat(np.arange(len(self.shards), dtype=np.int32), np.diff(self.starts))

    def slot_size(self, k: int) -> int:
        return int(self.lengths[self.starts[k] : self.starts[k + 1]].sum())


@dataclass
class _Results:
    """What is known of each item: done, action, framed length, crc32, side-file offset (-1: in its slot), source bytes, reason."""

    done: np.ndarray
    action: np.ndarray
    length: np.ndarray
    crc: np.ndarray
    side: np.ndarray
    read: np.ndarray
    reasons: dict[int, str]

    @classmethod
    def empty(cls, count: int) -> "_Results":
        return cls(np.zeros(count, bool), np.zeros(count, np.int8), np.zeros(count, np.int64), np.zeros(count, np.uint32),
                   np.full(count, -1, np.int64), np.zeros(count, np.int64), {})  # fmt: skip


@dataclass(frozen=True)
class _UnitJob:
    """One unit to read, and for each wanted ordinal the items (with their slots) that take its bytes."""

    unit: StreamUnit
    ordinals: np.ndarray  # sorted, unique
    starts: np.ndarray  # ordinal j feeds items[starts[j]:starts[j + 1]]
    items: np.ndarray  # g
    positions: np.ndarray
    labels: np.ndarray
    shards: np.ndarray  # per item: index into slot_files
    slot_files: list[Path]
    offsets: np.ndarray
    lengths: np.ndarray
    resize: int | None
    quality: int


class StreamPack:
    """Write the ``todo`` shards of stream splits into ``dst`` (see the module docstring)."""

    def __init__(
        self,
        plan: PackPlan,
        todo: Sequence[ShardSpec],
        dst: Path,
        resize: int | None,
        quality: int,
        node_rank: int,
        advance: Callable[[int, int], None],
        collect: Callable[[ShardResult], None],
    ) -> None:
        self.plan, self.dst, self.resize, self.quality = plan, dst, resize, quality
        self.journal = Journal(dst)
        self.layout = _Layout.of(plan, todo)
        self.slots = self.journal.folder / SLOTS_DIR
        self.checkpoint_path = self.journal.folder / f"stream-node{node_rank}.npz"
        self.side_path = self.slots / f"node{node_rank}.side"
        self.advance, self.collect = advance, collect
        self.results = _Results.empty(len(self.layout.positions))
        self.shard_of = self.layout.shard
        self.remaining = np.diff(self.layout.starts)
        self.finished = np.zeros(len(todo), bool)
        self.every_s = float(os.environ.get(CHECKPOINT_ENV, CHECKPOINT_S))
        self.last_checkpoint = time.monotonic()
        self.recorded = False  # results taken since the last checkpoint

    def slot_file(self, k: int) -> Path:
        return self.slots / f"{self.layout.shards[k].name}.rec"

    # ------------------------------------------------------------------------- run

    def run(self, workers: int) -> None:
        try:
            self._prepare_slots()
            self.side = os.open(self.side_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise self._failure("laying out the shards", e) from e
        try:
            self.side_bytes = self._resume()
            self._finish_ready()
            jobs = self._jobs()
            workers = min(workers, len(jobs))
            if workers <= 1:
                for job in jobs:
                    read_unit(job, self._record)
                    self._maybe_checkpoint()
            else:
                self._run_pool(jobs, workers)
            self._finish_ready()
        except BaseException as e:
            self._last_checkpoint()
            if isinstance(e, OSError):  # writing slots, the side file, a checkpoint or a shard
                raise self._failure("writing records", e) from e
            raise
        finally:
            os.close(self.side)
        self._clean_up()

    def _last_checkpoint(self) -> None:
        """On the way out of a failed run: keep what was written for the rerun, if the disk still lets us."""
        if not self.recorded:
            return
        try:
            self._checkpoint()
        except OSError as e:
            logger.warning("%s: could not write the checkpoint (%s); the rerun reads those units again", self.checkpoint_path, e)

    def _run_pool(self, jobs: list[_UnitJob], workers: int) -> None:
        """Read the units in ``workers`` processes; once every unit has a reader, idle workers help:
        readers hand them members (``_help``), so a few long .tar.gz streams keep every worker busy."""
        context = pool_context()
        results, members, waiting = context.Queue(), context.SimpleQueue(), context.Value("i", 0)
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(results, members, waiting, os.getpid()))
        units: dict[Future, _UnitJob] = {}
        helpers: set[Future] = set()
        stopping = False
        try:
            units = {pool.submit(_read_unit_in_worker, job): job for job in jobs}
            pending = set(units)
            while pending or helpers:
                if pending:
                    for _ in range(workers - len(pending) - len(helpers)):
                        helpers.add(pool.submit(_help, jobs[0].slot_files, self.resize, self.quality))
                elif not stopping:
                    for _ in helpers:
                        members.put(None)  # every unit is read, and every member handed out is in the queue before these
                    stopping = True
                self._drain(results)
                done, _ = wait(pending | helpers, timeout=0.05, return_when=FIRST_COMPLETED)
                for future in done:
                    job = units.get(future)
                    try:
                        future.result()
                    except BrokenProcessPool:
                        where = f"reading {job.unit}" if job else "writing records"
                        raise PackError(f"a pack worker died while {where} (killed, or out of memory?); rerun to resume") from None
                    except ImgpipeError:
                        raise
                    except Exception as e:
                        raise self._failure(f"reading {job.unit}" if job else "writing records", e) from e
                pending -= done
                helpers -= done
                self._maybe_checkpoint()
            self._drain_all(results)
        except BaseException:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=True, cancel_futures=True)
            self._drain(results)
            raise
        else:
            pool.shutdown(wait=True)
        finally:
            results.close()
            members.close()

    def _failure(self, doing: str, error: Exception) -> PackError:
        """One line: a full or read-only DST says what to do and that a rerun resumes; anything else names what failed."""
        if isinstance(error, OSError) and (error.errno in NO_SPACE or error.errno == errno.EROFS):
            return PackError(
                f"DST {self.dst}: {doing} failed: {describe(error, writing=True)}; then rerun the same command to resume "
                "(the records written are kept)"
            )
        return PackError(f"{doing} failed: {type(error).__name__}: {error}")

    def _drain(self, results: Any) -> None:
        """Take the results that have arrived (for at most half a second)."""
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                batch = results.get(timeout=0.01)
            except (queue_module.Empty, OSError, ValueError, EOFError):
                return
            self._record(batch)

    def _drain_all(self, results: Any) -> None:
        """Every job has returned: wait for the results still in the queue, until every item is done."""
        while not self.results.done.all():
            try:
                self._record(results.get(timeout=RESULTS_TIMEOUT_S))
            except queue_module.Empty:
                missing = int((~self.results.done).sum())
                raise PackError(f"{missing} record(s) were read but their results never arrived; rerun to resume") from None

    def _record(self, batch: list[tuple[int, int, str | None, int, int, bytes | None, int]]) -> None:
        """Take a worker's results: (item, action, reason, framed length, crc32, framed bytes if longer than the slot, source bytes)."""
        r = self.results
        images = nbytes = 0
        for g, action, reason, length, crc, extra, read in batch:
            if r.done[g]:
                continue
            if extra is not None:
                os.pwrite(self.side, extra, self.side_bytes)
                r.side[g] = self.side_bytes
                self.side_bytes += len(extra)
            r.done[g], r.action[g], r.length[g], r.crc[g], r.read[g] = True, action, length, crc, read
            if reason:
                r.reasons[g] = reason
            self.remaining[self.shard_of[g]] -= 1
            self.recorded = True
            images += 1
            nbytes += read
        self.advance(images, nbytes)
        self._finish_ready()

    # ------------------------------------------------------------------------- layout and jobs

    def _prepare_slots(self) -> None:
        """A sparse slot file per shard to write, of its laid-out size; those of journaled shards (a kill after the journal entry) go."""
        self.slots.mkdir(parents=True, exist_ok=True)
        for stale in self.slots.glob("*.rec"):
            if self.journal.read_entry(stale.name[: -len(".rec")]) is not None:
                stale.unlink()
        for k in range(len(self.layout.shards)):
            path = self.slot_file(k)
            size = self.layout.slot_size(k)
            if path.exists() and path.stat().st_size == size:
                continue
            with open(path, "wb") as f:
                f.truncate(size)

    def _jobs(self) -> list[_UnitJob]:
        """A job per unit with items not done: the ordinals to read and the slots they fill, biggest unit first."""
        layout, todo = self.layout, np.flatnonzero(~self.results.done)
        shard = self.shard_of[todo]
        slot_files = [self.slot_file(k) for k in range(len(layout.shards))]
        jobs = []
        order = np.lexsort((layout.ordinals[todo], layout.unit[todo]))
        todo, shard = todo[order], shard[order]
        bounds = np.flatnonzero(np.diff(layout.unit[todo])) + 1
        for group, group_shard in zip(np.split(todo, bounds), np.split(shard, bounds)):
            if not len(group):
                continue
            ordinals, first = np.unique(layout.ordinals[group], return_index=True)
            jobs.append(_UnitJob(
                layout.units[int(layout.unit[group[0]])], ordinals, np.append(first, len(group)), group, layout.positions[group],
                layout.labels[group], group_shard.astype(np.int32), slot_files, layout.offsets[group], layout.lengths[group],
                self.resize, self.quality,
            ))  # fmt: skip
        return sorted(jobs, key=lambda job: -int(layout.sizes[job.items].sum()))

    # ------------------------------------------------------------------------- checkpoints

    def _maybe_checkpoint(self) -> None:
        if self.recorded and time.monotonic() - self.last_checkpoint >= self.every_s:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Make every written slot durable, then record which records are written."""
        for k in range(len(self.layout.shards)):
            if not self.finished[k] and self.slot_file(k).exists():
                fd = os.open(self.slot_file(k), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        os.fsync(self.side)
        r, layout = self.results, self.layout
        done = np.flatnonzero(r.done)
        shard = self.shard_of[done]
        shard_of = layout.shard
        reasons = {f"{int(layout.positions[g])}@{layout.shards[shard_of[g]].name}": text for g, text in r.reasons.items()}
        meta = {"fingerprint": self.plan.fingerprint, "side_bytes": self.side_bytes, "reasons": reasons}
        buffer = io.BytesIO()
        np.savez(buffer, shard_names=np.array([layout.shards[k].name for k in shard], dtype="U64"), positions=layout.positions[done],
                 action=r.action[done], length=r.length[done], crc=r.crc[done], side=r.side[done], read=r.read[done],
                 meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))  # fmt: skip
        atomic_write_bytes(self.checkpoint_path, buffer.getvalue())
        self.last_checkpoint, self.recorded = time.monotonic(), False

    def _resume(self) -> int:
        """Take the records a killed run wrote from its checkpoint; return the side file's valid length."""
        try:
            with np.load(self.checkpoint_path, allow_pickle=False) as data:
                meta = json.loads(data["meta"].tobytes())
                arrays = {name: data[name] for name in ("shard_names", "positions", "action", "length", "crc", "side", "read")}
        except FileNotFoundError:
            os.ftruncate(self.side, 0)
            return 0
        except (OSError, ValueError, KeyError) as e:
            logger.warning("%s: unreadable checkpoint (%s); reading every unit again", self.checkpoint_path, e)
            os.ftruncate(self.side, 0)
            return 0
        if meta.get("fingerprint") != self.plan.fingerprint:
            os.ftruncate(self.side, 0)
            return 0
        layout = self.layout
        names = [layout.shards[k].name for k in layout.shard.tolist()]
        where = {(name, p): g for g, (name, p) in enumerate(zip(names, layout.positions.tolist()))}
        r = self.results
        taken = []
        for j, (name, position) in enumerate(zip(arrays["shard_names"].tolist(), arrays["positions"].tolist())):
            g = where.get((name, position))
            if g is None:
                continue
            r.done[g], r.action[g], r.length[g], r.crc[g], r.side[g], r.read[g] = (
                True, arrays["action"][j], arrays["length"][j], arrays["crc"][j], arrays["side"][j], arrays["read"][j])  # fmt: skip
            reason = meta["reasons"].get(f"{position}@{name}")
            if reason:
                r.reasons[g] = reason
            taken.append(g)
        if taken:
            counts = np.bincount(self.shard_of[taken], minlength=len(self.layout.shards))
            self.remaining -= counts
            logger.info("resuming: %d of %d records were written before; reading the rest", len(taken), len(r.done))
        side_bytes = int(meta.get("side_bytes", 0))
        os.ftruncate(self.side, side_bytes)
        return side_bytes

    # ------------------------------------------------------------------------- finishing shards

    def _finish_ready(self) -> None:
        """Publish every shard whose records are all written; several at once in threads (sha256 and copies release the GIL)."""
        ready = np.flatnonzero((self.remaining == 0) & ~self.finished).tolist()
        if len(ready) > 1:
            with ThreadPoolExecutor(min(len(ready), available_cpus())) as threads:
                published = list(threads.map(self._finish, ready))
        else:
            published = [self._finish(k) for k in ready]
        for k, result in zip(ready, published):
            self.collect(result)
            self.finished[k] = True

    def _finish(self, k: int) -> ShardResult:
        """Publish shard k: its slot file as it is when every record filled its slot, else compacted; then journal it."""
        spec, layout, r = self.layout.shards[k], self.layout, self.results
        items = range(int(layout.starts[k]), int(layout.starts[k + 1]))
        kept = [g for g in items if r.action[g] != SKIPPED]
        exact = len(kept) == len(items) and all(r.side[g] < 0 and r.length[g] == layout.lengths[g] for g in kept)
        rec_tmp, idx_tmp = tmp_names(self.dst, spec)
        slot = self.slot_file(k)
        if exact:
            rec_sha = sha256_file(slot)
            with open(slot, "rb") as f:
                os.fsync(f.fileno())
            index = "".join(format_index_line(int(layout.positions[g]), int(layout.offsets[g])) for g in kept).encode("ascii")
            atomic_write_bytes(idx_tmp, index)
            os.replace(slot, self.dst / spec.rec_name)
            rec_bytes, rec_sha, idx_sha, idx_bytes = layout.slot_size(k), rec_sha, hashlib.sha256(index).hexdigest(), len(index)
        else:
            with open(slot, "rb") as slots, IndexedRecordWriter(rec_tmp, idx_tmp) as writer:
                for g in kept:
                    source, offset = (self.side, int(r.side[g])) if r.side[g] >= 0 else (slots.fileno(), int(layout.offsets[g]))
                    writer.write_framed(int(layout.positions[g]), os.pread(source, int(r.length[g]), offset))
                writer.flush_to_disk()
            os.replace(rec_tmp, self.dst / spec.rec_name)
            rec_bytes, rec_sha, idx_sha, idx_bytes = writer.position, writer.rec_sha256, writer.idx_sha256, writer.idx_bytes
        os.replace(idx_tmp, self.dst / spec.idx_name)
        fsync_dir(self.dst)
        actions = Counter(ACTIONS[int(r.action[g])] for g in kept)
        repairs = Counter(r.reasons[g] for g in kept if r.action[g] == ACTIONS.index("repaired") and g in r.reasons)
        result = ShardResult(
            name=spec.name, records=len(kept), bytes=rec_bytes, sha256=rec_sha, index_bytes=idx_bytes, index_sha256=idx_sha,
            skipped=[(int(layout.positions[g]), r.reasons.get(g, "unreadable image")) for g in items if r.action[g] == SKIPPED],
            actions=dict(sorted(actions.items())), repairs=dict(sorted(repairs.items())), crc32=[int(r.crc[g]) for g in kept],
            source_bytes=int(r.read[list(items)].sum()),
        )  # fmt: skip
        self.journal.write_entry(result)
        slot.unlink(missing_ok=True)
        return result

    def _clean_up(self) -> None:
        """Every shard is published: the slots, the side file and the checkpoint go."""
        self.checkpoint_path.unlink(missing_ok=True)
        self.side_path.unlink(missing_ok=True)
        for k in range(len(self.layout.shards)):
            self.slot_file(k).unlink(missing_ok=True)
        try:
            self.slots.rmdir()
        except OSError:  # another node's side file or slots are still there
            pass


# ----------------------------------------------------------------------------- worker side


def read_unit(job: _UnitJob, emit: Emit, hand_off: Callable[[bytes, list[_Entry]], bool] | None = None) -> None:
    """Read ``job.unit`` once; write each wanted member's records into their slots, unless ``hand_off`` takes
    the member to a helper; ``emit`` the results."""
    fds: dict[int, int] = {}
    batch: list[tuple[int, int, str | None, int, int, bytes | None, int]] = []
    last = time.monotonic()
    try:
        for j, (ordinal, data) in enumerate(job.unit.read(job.ordinals)):
            if ordinal != job.ordinals[j]:  # pragma: no cover - readers yield what was asked, in order
                raise PackError(f"{job.unit}: expected member {job.ordinals[j]}, got {ordinal}")
            entries = [(int(job.items[i]), float(job.labels[i]), int(job.positions[i]), int(job.shards[i]), int(job.offsets[i]),
                        int(job.lengths[i])) for i in range(int(job.starts[j]), int(job.starts[j + 1]))]  # fmt: skip
            if hand_off is None or not hand_off(data, entries):
                batch += write_member(data, entries, fds, job.slot_files, job.resize, job.quality)
            if time.monotonic() - last >= REPORT_EVERY_S:
                emit(batch)
                batch, last = [], time.monotonic()
        emit(batch)
    finally:
        for fd in fds.values():
            os.close(fd)


def write_member(
    data: bytes, entries: list[_Entry], fds: dict[int, int], slot_files: list[Path], resize: int | None, quality: int
) -> list[tuple[int, int, str | None, int, int, bytes | None, int]]:
    """Prepare one member and write a record of it for each of its items into its slot; the results."""
    prepared = codec.prepare_image(data, resize=resize, quality=quality)
    results: list[tuple[int, int, str | None, int, int, bytes | None, int]] = []
    for g, label, position, shard, offset, length in entries:
        if prepared.data is None:
            results.append((g, SKIPPED, prepared.reason or "unreadable image", 0, 0, None, len(data)))
            continue
        record = pack_header(IRHeader(0, label, position, 0), prepared.data)
        parts = frame_parts(memoryview(record))  # views of the record: written as they are, not joined
        framed = sum(map(len, parts))
        extra = None
        if framed <= length:
            fd = fds.get(shard)
            if fd is None:
                if len(fds) >= MAX_OPEN_SLOTS:
                    for open_fd in fds.values():
                        os.close(open_fd)
                    fds.clear()
                fd = fds[shard] = os.open(slot_files[shard], os.O_WRONLY)
            _pwritev_all(fd, parts, offset, framed)
        else:
            extra = b"".join(parts)
        reason = prepared.reason if prepared.action == "repaired" else None
        results.append((g, ACTIONS.index(prepared.action), reason, framed, crc32(record), extra, len(data)))
    return results


def _pwritev_all(fd: int, parts: list[memoryview | bytes], offset: int, total: int) -> None:
    """Write ``parts`` (``total`` bytes) one after another at ``offset``, the rest of a short write too."""
    written = os.pwritev(fd, parts, offset)
    rest = b"".join(parts)[written:] if written < total else b""  # a short write: the disk filling up, say
    while rest:
        count = os.pwrite(fd, rest, offset + written)
        rest, written = rest[count:], written + count


_worker: dict[str, Any] = {}


def _init_worker(results: Any, members: Any, waiting: Any, parent_pid: int) -> None:
    _worker.update(results=results, members=members, waiting=waiting)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    die_with_parent(parent_pid)


def _hand_off(data: bytes, entries: list[_Entry]) -> bool:
    """Give the member to a helper that waits for work, if one does (reserved, so the put never waits on a busy one)."""
    waiting = _worker["waiting"]
    with waiting.get_lock():
        if waiting.value <= 0:
            return False
        waiting.value -= 1
    _worker["members"].put((data, entries))  # a SimpleQueue: in the pipe before this unit's job returns
    return True


def _read_unit_in_worker(job: _UnitJob) -> None:
    read_unit(job, _worker["results"].put, _hand_off)


def _help(slot_files: list[Path], resize: int | None, quality: int) -> None:
    """Write the members readers hand out, until the parent says every unit is read (a None)."""
    members, waiting, fds = _worker["members"], _worker["waiting"], {}
    try:
        while True:
            with waiting.get_lock():
                waiting.value += 1  # a reader that hands this helper a member takes it back
            member = members.get()
            if member is None:
                return
            _worker["results"].put(write_member(*member, fds, slot_files, resize, quality))
    finally:
        for fd in fds.values():
            os.close(fd)
