"""Several processes and one local DST: the lock, waiting for the manifest, and the record of a failure.

The first stager to take ``DST/.imgpipe-stage/lock`` copies; the others wait until the manifest
appears (then return) or the lock comes free (a holder killed with ``kill -9``: they take the
lock over and go on from the journal). A stager that fails records why in ``failed.json``,
which the trainer's other local ranks (``wait_for_copy``: they never copy) report in one line. A
wait fails when DST's journal folder shows no progress for ``STALL_S``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.jsonfile import loads
from imgpipe._sys.pidlock import describe_holder, holder_alive, is_held, lock_holder, try_lock
from imgpipe._sys.procs import process_start_time
from imgpipe._sys.regular import read_regular
from imgpipe.errors import DatasetError
from imgpipe.staging.target import LocalTarget

logger = logging.getLogger(__name__)

POLL_S = 0.5  # how often a waiting process looks at DST
STALL_S = 900.0  # a wait fails when the stage it waits for shows no progress for this long
FRESH_S = 10.0  # a failure record or lock up to this long older than the waiting process belongs to its launch


def lock_or_wait(target: LocalTarget, manifest_bytes: bytes, stall_s: float = STALL_S) -> int | None:
    """The lock of DST (its descriptor), or None once another stager has finished the copy."""
    progress = _Progress(target, stall_s)
    told = False
    while True:
        fd = try_lock(target.lock_path)
        if fd is not None:
            return fd
        if target.manifest_bytes() == manifest_bytes:
            return None
        holder = lock_holder(target.lock_path)
        if not told:
            logger.info("%s: another imgpipe stage (%s) is copying there; waiting for it", target.location, describe_holder(holder))
            told = True
        progress.check(
            f"{target.location}: the imgpipe stage copying there ({describe_holder(holder)}) made no "
            f"progress for {stall_s:.0f} s; stop it and rerun"
        )
        time.sleep(POLL_S)


def wait_for_copy(target: LocalTarget, manifest_bytes: bytes, src: str, stall_s: float = STALL_S) -> None:
    """Wait, without ever copying, until DST holds the manifest ``manifest_bytes``; one line when the
    stager of this launch recorded a failure, died before finishing, or stalls."""
    dst = target.location
    since = (process_start_time() or time.time()) - FRESH_S
    progress = _Progress(target, stall_s)
    while target.manifest_bytes() != manifest_bytes:
        failure = _read_failure(target, since)
        if failure is not None:
            raise DatasetError(f"{dst}: local rank 0 could not stage {src} there: {failure}")
        holder = lock_holder(target.lock_path)
        if holder is not None and _modified_since(target.lock_path, since) and not holder_alive(*holder) and not is_held(target.lock_path):
            raise DatasetError(
                f"{dst}: local rank 0 ({describe_holder(holder)}) stopped staging {src} there before it finished; rerun to resume the copy"
            )
        progress.check(f"{dst}: waited {stall_s:.0f} s for local rank 0 to stage {src} there, and saw no progress; is it running?")
        time.sleep(POLL_S)


def record_failure(target: LocalTarget, error: BaseException) -> None:
    """Leave why this stage failed where the processes waiting for it look."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), "error": str(error) or type(error).__name__}
    try:
        atomic_write_bytes(target.failure_path, json.dumps(record).encode("utf-8"))
    except OSError:  # DST itself is what failed (full, read-only): the waiters see the stall instead
        pass


class _Progress:
    """Fails a wait once DST's journal folder (parts written, files journaled) stops changing for ``stall_s``."""

    def __init__(self, target: LocalTarget, stall_s: float) -> None:
        self.target = target
        self.stall_s = stall_s
        self.seen = self._state()
        self.since = time.monotonic()

    def _state(self) -> tuple[int, int]:
        try:
            stats = [entry.stat() for entry in os.scandir(self.target.journal)]
        except OSError:
            return (0, 0)
        return len(stats), max((s.st_mtime_ns for s in stats), default=0)

    def check(self, message: str) -> None:
        state = self._state()
        if state != self.seen:
            self.seen, self.since = state, time.monotonic()
        elif time.monotonic() - self.since > self.stall_s:
            raise DatasetError(message)


def _read_failure(target: LocalTarget, since: float) -> str | None:
    """The error a stage of this launch recorded (written after ``since``), if any."""
    try:
        record = loads(read_regular(target.failure_path))
        return str(record["error"]) if float(record["time"]) >= since else None
    except (OSError, ValueError, KeyError, TypeError, OverflowError):  # OverflowError: a time of 400 digits
        return None


def _modified_since(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False
