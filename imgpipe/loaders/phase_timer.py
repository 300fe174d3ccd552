"""The torch loader's timing hook, for tools that attribute a batch's time to its phases (``imgpipe bench``).

A torch loader made by ``make_torch_loader`` inside ``with timing(PhaseTimer()):`` is timed: the worker
that builds a batch measures its record reads and the rest of its work (decode, crop, flip, writing into
the batch), and from a URL its store requests, bytes and seconds; the main process adds its own time on
the batch (copy out of the ring and normalization on the CPU; pinning and queueing the copy on a GPU) and
hands them to :meth:`PhaseTimer.record`, in the order the batches are built. The loader runs exactly as
without the hook, and no public argument names it.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass
class BatchTimes:
    """Seconds one batch spent in each loader phase."""

    read: float = 0.0  # worker: fetching the batch's records and reading each
    decode: float = 0.0  # worker: everything else it did for the batch (decode, crop, flip, write)
    collate: float = 0.0  # main process: from the worker's reply to the batch handed out (or queued for the GPU)
    requests: int = 0  # worker, from a URL: HTTP requests its store client made while it built the batch
    request_calls: int = 0  # the calls (one per file and batch) those requests were made in
    request_s: float = 0.0  # the seconds those calls took, summed (each call's requests run concurrently)
    fetched_bytes: int = 0  # the bytes they brought


def request_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """What a store client did between two of its ``request_stats()`` (zeros for a local folder), as BatchTimes fields."""
    if before is None or after is None:
        return {}
    return {
        "requests": int(after["requests"] - before["requests"]),
        "request_calls": int(after["calls"] - before["calls"]),
        "request_s": after["seconds"] - before["seconds"],
        "fetched_bytes": int(after["bytes"] - before["bytes"]),
    }


class PhaseTimer:
    """Collects each batch's :class:`BatchTimes`; :meth:`take` returns them oldest first.

    :meth:`read` is how the loader's workers read a record while timed: a subclass may slow it
    down (the bench's slow-disk hook). The object travels to the workers with the dataset, so
    it must pickle.
    """

    def __init__(self) -> None:
        self._times: collections.deque[BatchTimes] = collections.deque()

    def read(self, records: Any, k: int) -> tuple[Any, memoryview]:
        """Read the ``k``-th record of a batch's ``records`` (``ShardSet.fetch``), in a loader worker."""
        return records.read_view(k)

    def record(self, times: BatchTimes) -> None:
        """The loader reports one more batch (in the main process)."""
        self._times.append(times)

    def take(self) -> BatchTimes:
        """The oldest batch's times not taken yet; zeros when the loader has reported none."""
        return self._times.popleft() if self._times else BatchTimes()


_ACTIVE: contextvars.ContextVar[PhaseTimer | None] = contextvars.ContextVar("imgpipe_phase_timer", default=None)


@contextlib.contextmanager
def timing(timer: PhaseTimer) -> Iterator[PhaseTimer]:
    """Torch loaders made inside this block report each batch's phase times to ``timer``, for their whole life."""
    token = _ACTIVE.set(timer)
    try:
        yield timer
    finally:
        _ACTIVE.reset(token)


def active_timer() -> PhaseTimer | None:
    """The timer of the innermost ``timing`` block around this call, if any (what a new torch loader reports to)."""
    return _ACTIVE.get()
