"""Write a pack's shards: read the source in storage order and put every record into its planned slot.

The parts: ``slots`` lays the shards out (a sparse slot file each), ``readorder`` cuts the
items into jobs in the order the storage holds them, workers read a job and write each record
into its slot (``SlotWriter``), the parent takes their results, publishes each shard once its
records are all written (``publish``) and saves which are written (``progress``), so a
rerun after kill -9 reads only the records not written. Once every job has a worker, idle
workers help: readers hand them members, so a few long ``.tar.gz`` streams keep all busy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as queue_module
import signal
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from imgpipe._sys.checksum import crc32
from imgpipe._sys.procs import die_with_parent, pool_context
from imgpipe.errors import ImgpipeError, PackError
from imgpipe.format.recordio import IR_SIZE, MAX_RECORD_BYTES, IRHeader, frame_parts, pack_header
from imgpipe.image import codec
from imgpipe.packing.journal import Journal, ShardResult
from imgpipe.packing.plan import PackPlan, ShardSpec
from imgpipe.packing.progress import CHECKPOINT_S, ProgressFile, progress_path
from imgpipe.packing.publish import Publisher, write_failure
from imgpipe.packing.readorder import Entry, ReadJob, ReadOrder
from imgpipe.packing.slots import ACTIONS, SKIPPED, SLOTS_DIR, ItemResults, SideFile, SlotMap

logger = logging.getLogger(__name__)

REPORT_EVERY_S = 0.2
RESULTS_TIMEOUT_S = 60.0
MAX_OPEN_SLOTS = 512  # slot files a worker keeps open (a job feeds every shard)
TOO_LARGE_REASON = "image too large for a RecordIO record (512 MiB with its header); shrink it, or pack with --resize"


@dataclass
class Written:
    """What a worker did with the items of the members it read, sent to the parent a batch at a time: per item its
    action, framed length, crc32 and source bytes; by item the rare reason, and a record longer than its slot."""

    items: list[int] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    crcs: list[int] = field(default_factory=list)
    reads: list[int] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    extras: dict[int, bytes] = field(default_factory=dict)

    def add(self, g: int, action: int, length: int, crc: int, read: int, reason: str | None = None) -> None:
        self.items.append(g)
        self.actions.append(action)
        self.lengths.append(length)
        self.crcs.append(crc)
        self.reads.append(read)
        if reason:
            self.reasons[g] = reason


@dataclass(frozen=True)
class WorkerSetup:
    """What every worker needs besides its jobs: where the slots are and how to prepare an image."""

    dst: Path
    slot_files: list[Path]
    resize: int | None
    quality: int


class Scatter:
    """Write the ``todo`` shards of ``plan`` into ``dst`` (see the module docstring)."""

    def __init__(
        self,
        plan: PackPlan,
        todo: Sequence[ShardSpec],
        root: Path,
        dst: Path,
        *,
        resize: int | None,
        quality: int,
        node_rank: int,
        advance: Callable[[int, int], None],
        collect: Callable[[ShardResult], None],
        checkpoint_s: float = CHECKPOINT_S,
    ) -> None:
        self.plan, self.dst, self.node_rank, self.checkpoint_s = plan, dst, node_rank, checkpoint_s
        self.advance, self.collect = advance, collect
        self.journal = Journal(dst)
        self.slot_map = SlotMap.of(plan, todo, self.journal.folder / SLOTS_DIR)
        self.order = ReadOrder(plan, self.slot_map, root)
        self.results = ItemResults.empty(len(self.slot_map))
        self.setup = WorkerSetup(dst, self.slot_map.slot_files(), resize, quality)

    def run(self, workers: int) -> None:
        try:
            fresh = self.slot_map.make_slot_files(self.journal)
            self.side = SideFile(self.slot_map.folder / f"node{self.node_rank}.side")
        except OSError as e:
            raise write_failure(self.dst, "laying out the shards", e) from e
        path = progress_path(self.journal.folder, self.node_rank)
        self.progress_file = ProgressFile(path, self.plan.fingerprint, self.slot_map, self.results, self.side, self.checkpoint_s)
        self.publisher = Publisher(self.slot_map, self.results, self.side, self.dst, self.collect)
        try:
            self.publisher.taken(self.progress_file.load(fresh))
            self.publisher.publish_ready()
            groups = self.order.groups(np.flatnonzero(~self.results.done), workers)
            workers = min(workers, len(groups))
            logger.debug("reading %d record(s) in %d job(s) with %d worker(s)", int((~self.results.done).sum()), len(groups), workers)
            if workers <= 1:
                self._run_inline(groups)
            else:
                self._run_pool(groups, workers)
            self.publisher.publish_ready()
        except BaseException as e:
            self.progress_file.save_on_the_way_out(self.publisher.finished)
            if isinstance(e, OSError):  # the side file or the progress file
                raise write_failure(self.dst, "writing shards", e) from e
            raise
        finally:
            self.side.close()
        self._clean_up(path)

    def _run_inline(self, groups: list[np.ndarray]) -> None:
        writer = SlotWriter(self.setup)
        try:
            for group in groups:
                job = self.order.job(group)
                try:
                    read_job(job, self._record, writer)
                except ImgpipeError:
                    raise
                except Exception as e:
                    raise write_failure(self.dst, f"reading {job.what}", e) from e
        finally:
            writer.close()

    def _run_pool(self, groups: list[np.ndarray], workers: int) -> None:
        """Read the jobs in ``workers`` processes, handed out in storage order; helpers come in once every job has a reader."""
        context = pool_context()
        results, members, waiting = context.Queue(), context.SimpleQueue(), context.Value("i", 0)
        initargs = (results, members, waiting, os.getpid(), self.setup)
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=initargs)
        queued = iter(groups)
        jobs: dict[Future, str] = {}  # a reading job -> what it reads
        helpers: set[Future] = set()
        exhausted = stopping = False
        try:
            while jobs or helpers or not exhausted:
                while not exhausted and len(jobs) < 2 * workers:
                    group = next(queued, None)
                    if group is None:
                        exhausted = True
                        break
                    job = self.order.job(group)
                    jobs[pool.submit(_read_job_in_worker, job)] = job.what
                if exhausted and jobs:
                    for _ in range(workers - len(jobs) - len(helpers)):
                        helpers.add(pool.submit(_help))
                elif exhausted and not stopping:
                    for _ in helpers:
                        members.put(None)  # every job is read, and every member handed out is in the queue before these
                    stopping = True
                self._drain(results)
                done, _ = wait(set(jobs) | helpers, timeout=0.05, return_when=FIRST_COMPLETED)
                for future in done:
                    what = jobs.pop(future, None)
                    helpers.discard(future)
                    doing = f"reading {what}" if what else "writing records"
                    try:
                        future.result()
                    except BrokenProcessPool:
                        raise PackError(f"a pack worker died while {doing} (killed, or out of memory?); rerun to resume") from None
                    except ImgpipeError:
                        raise
                    except Exception as e:
                        raise write_failure(self.dst, doing, e) from e
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

    def _record(self, written: Written) -> None:
        """Take a worker's results; a record longer than its slot goes to the side file.

        A failure here is DST's (the side file, the progress file, a journal entry), named as such even
        when the reading runs in this process and its job is the one on the stack."""
        try:
            self._take(written)
        except OSError as e:
            raise write_failure(self.dst, "writing shards", e) from e

    def _take(self, written: Written) -> None:
        r = self.results
        g = np.array(written.items, np.int64)
        new = ~r.done[g]
        for item, extra in written.extras.items():
            if not r.done[item]:
                r.side[item] = self.side.append(extra)
        r.reasons.update((item, text) for item, text in written.reasons.items() if not r.done[item])
        columns = (written.actions, written.lengths, written.crcs, written.reads)
        action, length, crc, read = (np.array(c, dtype)[new] for c, dtype in zip(columns, (np.int8, np.int64, np.uint32, np.int64)))
        g = g[new]
        r.done[g], r.action[g], r.length[g], r.crc[g], r.read[g] = True, action, length, crc, read
        if len(g):
            self.publisher.taken(g)
            self.progress_file.recorded = True
        self.advance(len(g), int(read.sum()))
        if self.progress_file.due():
            self.progress_file.save(self.publisher.finished)
        self.publisher.publish_ready()

    def _clean_up(self, progress: Path) -> None:
        """Every shard is published: the slots, the side file and the progress file go."""
        progress.unlink(missing_ok=True)
        self.side.path.unlink(missing_ok=True)
        self.slot_map.remove()
        try:
            self.slot_map.folder.rmdir()
        except OSError:  # another node's side file or slots are still there
            pass


# ----------------------------------------------------------------------------- worker side


class SlotWriter:
    """Prepare members and write their records into their slots, with the slot files open (the least recently used
    closed past ``MAX_OPEN_SLOTS``)."""

    def __init__(self, setup: WorkerSetup) -> None:
        self.setup = setup
        self.fds: OrderedDict[int, int] = OrderedDict()

    def write_member(self, data: bytes | str, entries: list[Entry], written: Written) -> None:
        """Prepare one member (``data``: its bytes, or why it has none), write a record of it for each of its items into
        its slot, and note what was done in ``written``."""
        if isinstance(data, str):
            for g, *_ in entries:
                written.add(g, SKIPPED, 0, 0, 0, data)
            return
        prepared = codec.prepare_image(data, resize=self.setup.resize, quality=self.setup.quality)
        action = ACTIONS.index(prepared.action)
        too_large = prepared.data is not None and len(prepared.data) + IR_SIZE >= MAX_RECORD_BYTES
        for g, label, position, shard, offset, length in entries:
            if prepared.data is None or too_large:
                written.add(g, SKIPPED, 0, 0, len(data), TOO_LARGE_REASON if too_large else prepared.reason or "unreadable image")
                continue
            record = pack_header(IRHeader(0, label, position, 0), prepared.data)
            parts = frame_parts(memoryview(record))  # views of the record: written as they are, not joined
            framed = sum(map(len, parts))
            if framed <= length:
                self._write(shard, parts, offset, framed)
            else:
                written.extras[g] = b"".join(parts)
            written.add(g, action, framed, crc32(record), len(data), prepared.reason if prepared.action == "repaired" else None)

    def _write(self, shard: int, parts: list[memoryview], offset: int, total: int) -> None:
        path = self.setup.slot_files[shard]
        try:
            fd = self.fds.get(shard)
            if fd is None:
                if len(self.fds) >= MAX_OPEN_SLOTS:
                    os.close(self.fds.popitem(last=False)[1])
                fd = self.fds[shard] = os.open(path, os.O_WRONLY)
            else:
                self.fds.move_to_end(shard)
            written = os.pwritev(fd, parts, offset)
            rest = b"".join(parts)[written:] if written < total else b""  # a short write: the disk filling up, say
            while rest:
                count = os.pwrite(fd, rest, offset + written)
                rest, written = rest[count:], written + count
        except OSError as e:
            raise write_failure(self.setup.dst, f"writing shard {path.name[: -len('.rec')]}", e) from None

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def read_job(
    job: ReadJob, emit: Callable[[Written], None], writer: SlotWriter, hand_off: Callable[[bytes | str, list[Entry]], bool] | None = None
) -> None:
    """Read ``job`` in its order; write each member's records into their slots, unless ``hand_off`` gives the member
    to a helper; ``emit`` what was written every ``REPORT_EVERY_S``."""
    written = Written()
    last = time.monotonic()
    starts, columns = job.starts.tolist(), job.columns()
    try:
        for j, data in enumerate(job.reads.read()):
            entries = list(zip(*(column[starts[j] : starts[j + 1]] for column in columns)))
            if hand_off is None or not hand_off(data, entries):
                writer.write_member(data, entries, written)
            if time.monotonic() - last >= REPORT_EVERY_S:
                emit(written)
                written, last = Written(), time.monotonic()
    except BaseException:
        with contextlib.suppress(Exception):
            emit(written)  # the records written before a bad member count: the progress file keeps them
        raise
    emit(written)


_worker: dict[str, Any] = {}


def _init_worker(results: Any, members: Any, waiting: Any, parent_pid: int, setup: WorkerSetup) -> None:
    _worker.update(results=results, members=members, waiting=waiting, writer=SlotWriter(setup))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    die_with_parent(parent_pid)


def _hand_off(data: bytes | str, entries: list[Entry]) -> bool:
    """Give the member to a helper that waits for work, if one does (reserved, so the put never waits on a busy one)."""
    waiting = _worker["waiting"]
    with waiting.get_lock():
        if waiting.value <= 0:
            return False
        waiting.value -= 1
    _worker["members"].put((data, entries))  # a SimpleQueue: in the pipe before this job returns
    return True


def _read_job_in_worker(job: ReadJob) -> None:
    read_job(job, _worker["results"].put, _worker["writer"], _hand_off)


def _help() -> None:
    """Write the members readers hand out, until the parent says every job is read (a None)."""
    members, waiting, writer = _worker["members"], _worker["waiting"], _worker["writer"]
    while True:
        with waiting.get_lock():
            waiting.value += 1  # a reader that hands this helper a member takes it back
        member = members.get()
        if member is None:
            return
        written = Written()
        writer.write_member(*member, written)
        _worker["results"].put(written)
