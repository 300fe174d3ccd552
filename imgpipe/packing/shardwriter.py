"""Write one planned shard: read each source, prepare it, frame it, then publish the shard atomically.

Runs inside a worker process. The shard is streamed to ``DST/.{name}.rec.tmp`` and
``.idx.tmp`` (with the sha256 and a per-record crc32 computed on the way), fsynced, renamed
to its final names, and only then journaled: a shard without a journal entry is never
trusted and is rewritten by the next run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from imgpipe._sys.atomic import fsync_dir
from imgpipe._sys.checksum import crc32
from imgpipe._sys.procs import die_with_parent
from imgpipe.format.recordio import IndexedRecordWriter, IRHeader, pack_header
from imgpipe.image import codec
from imgpipe.packing.journal import Journal, ShardResult
from imgpipe.packing.plan import ShardSpec

if TYPE_CHECKING:
    from imgpipe.ingest.members import MemberSpans

ProgressFn = Callable[[int, int], None]  # (images done, source bytes read) since the last call

REPORT_EVERY_S = 0.2


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs to write one shard (plain data, cheap to pickle)."""

    dst: Path
    src: Path
    spec: ShardSpec
    paths: Sequence[str]
    labels: Sequence[int]
    resize: int | None
    quality: int
    spans: MemberSpans | None = None  # archive sources: read item k from its span of an archive, not from a file


def tmp_names(dst: Path, spec: ShardSpec) -> tuple[Path, Path]:
    """The temporary .rec and .idx paths of a shard being written."""
    return dst / f".{spec.rec_name}.tmp", dst / f".{spec.idx_name}.tmp"


def _read_source(path: Path) -> bytes | str:
    """The file's bytes, or the reason it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return f"unreadable ({e.strerror or type(e).__name__})"


@contextlib.contextmanager
def _source_reader(job: ShardJob) -> Iterator[Callable[[int, str], bytes | str]]:
    """A reader of the job's item k (source path ``rel``): from its archive span, or from its file."""
    if job.spans is None:
        yield lambda k, rel: _read_source(job.src / rel)
        return
    from imgpipe.ingest.members import member_reader

    with member_reader(job.spans) as read:
        yield read


def write_shard(job: ShardJob, progress: ProgressFn | None = None) -> ShardResult:
    """Write the shard of ``job`` and journal it; return its result."""
    spec, dst = job.spec, job.dst
    rec_tmp, idx_tmp = tmp_names(dst, spec)
    skipped: list[tuple[int, str]] = []
    actions: Counter[str] = Counter()
    repairs: Counter[str] = Counter()
    crcs: list[int] = []
    source_bytes = 0
    pending_images = pending_bytes = 0
    last_report = time.monotonic()
    with _source_reader(job) as read, IndexedRecordWriter(rec_tmp, idx_tmp) as writer:
        for k, (rel, label) in enumerate(zip(job.paths, job.labels)):
            position = spec.start + k
            data = read(k, rel)
            if isinstance(data, str):
                skipped.append((position, data))
            else:
                source_bytes += len(data)
                pending_bytes += len(data)
                prepared = codec.prepare_image(data, resize=job.resize, quality=job.quality)
                actions[prepared.action] += 1
                if prepared.data is None:
                    skipped.append((position, prepared.reason or "unreadable image"))
                else:
                    if prepared.action == "repaired" and prepared.reason:
                        repairs[prepared.reason] += 1
                    record = pack_header(IRHeader(0, float(label), position, 0), prepared.data)
                    writer.write(position, record)
                    crcs.append(crc32(record))
            pending_images += 1
            if progress is not None and time.monotonic() - last_report >= REPORT_EVERY_S:
                progress(pending_images, pending_bytes)
                pending_images = pending_bytes = 0
                last_report = time.monotonic()
        writer.flush_to_disk()
    os.replace(rec_tmp, dst / spec.rec_name)
    os.replace(idx_tmp, dst / spec.idx_name)
    fsync_dir(dst)
    actions.pop("skipped", None)
    result = ShardResult(
        name=spec.name,
        records=len(crcs),
        bytes=writer.position,
        sha256=writer.rec_sha256,
        index_bytes=writer.idx_bytes,
        index_sha256=writer.idx_sha256,
        skipped=skipped,
        actions=dict(sorted(actions.items())),
        repairs=dict(sorted(repairs.items())),
        crc32=crcs,
        source_bytes=source_bytes,
    )
    Journal(dst).write_entry(result)
    if progress is not None and pending_images:
        progress(pending_images, pending_bytes)
    return result


# ----------------------------------------------------------------------------- worker process side

_progress_queue = None


def init_worker(queue: object, parent_pid: int) -> None:
    """Pool initializer: report progress on ``queue``; die with the parent so a killed pack leaves
    no orphan writing shards."""
    global _progress_queue
    _progress_queue = queue
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the pool
    die_with_parent(parent_pid)


def _queue_progress(images: int, nbytes: int) -> None:
    if _progress_queue is not None:
        _progress_queue.put((images, nbytes))


def write_shard_in_worker(job: ShardJob) -> ShardResult:
    """Entry point for pool workers: ``write_shard`` with progress sent to the parent."""
    return write_shard(job, _queue_progress)
