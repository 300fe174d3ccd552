"""Where one rank's time goes, and how the ranks compare.

``StepTimer`` times a loop's data wait (``iterate``: blocked in ``next(loader)``) and its compute
(``compute``; on CUDA by events); ``gather_summaries`` gives every rank's ``RankSummary`` on every rank
and ``format_rank_table`` prints them; the bench reuses the same pieces. ``imbalance`` is slowest/fastest
images/s: 1.0 is balanced, 0.5 means the slowest rank runs at half the fastest's speed (and DDP makes
every rank wait for it).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from imgpipe._sys.oserrors import describe
from imgpipe.errors import TrainError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepRecord:
    """One step of one rank: seconds blocked waiting for the batch, seconds computing, images."""

    data_s: float
    compute_s: float
    images: int

    @property
    def step_s(self) -> float:
        return self.data_s + self.compute_s


@dataclass(frozen=True)
class RankSummary:
    """One rank over a span of steps (an epoch, a bench run)."""

    rank: int
    images_per_s: float
    data_wait_frac: float
    step_p50_s: float
    step_p95_s: float
    steps: int
    images: int
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StepTimer:
    """Records StepRecords: wrap the loader with :meth:`iterate` and each step's work in :meth:`compute`.

    On the CPU both times are host times: ``data_s`` is how long ``next()`` blocked, ``compute_s``
    the step's work. On CUDA no step synchronizes the GPU: :meth:`compute` brackets the step
    with two CUDA events on the current stream, read once the GPU has passed them (at most
    ``LAG`` steps later). ``compute_s`` is the GPU time between them, and ``data_s`` the GPU's
    idle time before the step, from the previous step's end to this step's start: waiting for
    the batch (decode, copy) or for the host to queue the step. The first step after
    :meth:`reset` has no previous step: its ``data_s`` is the host's wait in ``next()``.
    The wall time ends when the GPU has finished the last step.
    """

    LAG = 4  # steps whose events may stay unread before the timer waits for the oldest

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self._cuda = device is not None and getattr(device, "type", str(device)).startswith("cuda")
        self._records: list[StepRecord] = []
        self._pending: deque[tuple[float, Any, Any, Any, int]] = deque()  # (host wait, previous end, start, end, images)
        self._previous_end: Any = None
        self._data_s = 0.0
        self._started: float | None = None
        self._ended: float | None = None

    @property
    def records(self) -> list[StepRecord]:
        """The steps whose times are known: on CUDA, all but those the GPU has not finished yet."""
        self._drain(keep=len(self._pending))
        return self._records

    def reset(self) -> None:
        """Forget the recorded steps (e.g. at the start of an epoch)."""
        self._records.clear()
        self._pending.clear()
        self._previous_end = None
        self._started = self._ended = None

    def iterate(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Yield ``loader``'s items, timing how long each ``next()`` blocked."""
        iterator = iter(loader)
        while True:
            start = time.perf_counter()
            if self._started is None:
                self._started = start
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._data_s = time.perf_counter() - start
            yield item

    @contextmanager
    def compute(self, images: int) -> Iterator[None]:
        """Time the work on one batch (see the class docstring for what is measured on CUDA)."""
        start = time.perf_counter()
        if self._started is None:
            self._started = start
        if not self._cuda:
            yield
            end = time.perf_counter()
            self._records.append(StepRecord(self._data_s, end - start, int(images)))
        else:
            import torch

            stream = torch.cuda.current_stream(self.device)
            begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            yield
            finish.record(stream)
            self._pending.append((self._data_s, self._previous_end, begin, finish, int(images)))
            self._previous_end = finish
            self._drain(keep=self.LAG)
            end = time.perf_counter()
        self._data_s = 0.0
        self._ended = end

    def summary(self, rank: int) -> RankSummary:
        """Summarize the recorded steps over the wall time from the first wait to the end of the last step."""
        if self._pending:
            self._drain(keep=0)  # waits for the GPU to finish the last step
            self._ended = time.perf_counter()
        wall = (self._ended - self._started) if self._started is not None and self._ended is not None else 0.0
        return summarize(self._records, rank, wall)

    def _drain(self, keep: int) -> None:
        """Record the steps the GPU has finished; wait for the oldest while more than ``keep`` are unread."""
        while self._pending:
            host_wait, previous, begin, finish, images = self._pending[0]
            if len(self._pending) > keep:
                finish.synchronize()
            elif not finish.query():
                return
            self._pending.popleft()
            idle = previous.elapsed_time(begin) / 1000 if previous is not None else host_wait
            self._records.append(StepRecord(idle, begin.elapsed_time(finish) / 1000, images))


def summarize(records: Sequence[StepRecord], rank: int, wall_s: float | None = None) -> RankSummary:
    """A RankSummary from step records; ``wall_s`` defaults to the sum of the step times."""
    wall = sum(r.step_s for r in records) if wall_s is None else wall_s
    images = sum(r.images for r in records)
    steps = sorted(r.step_s for r in records)
    data = sum(r.data_s for r in records)
    return RankSummary(
        rank=rank,
        images_per_s=images / wall if wall > 0 else 0.0,
        data_wait_frac=min(1.0, data / wall) if wall > 0 else 0.0,
        step_p50_s=percentile(steps, 50),
        step_p95_s=percentile(steps, 95),
        steps=len(records),
        images=images,
        wall_s=wall,
    )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def synchronize(device: Any) -> None:
    """Wait for the device's queued work (CUDA only)."""
    if device is not None and getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def gather_objects(value: Any) -> list[Any]:
    """Every rank's picklable ``value``, in rank order, on every rank; ``[value]`` without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def gather_summaries(summary: RankSummary) -> list[RankSummary]:
    """Every rank's summary, in rank order, on every rank; just ``[summary]`` without a process group."""
    return [RankSummary(**item) for item in gather_objects(summary.to_dict())]


def imbalance(summaries: Sequence[RankSummary]) -> float:
    """Slowest rank's images/s over the fastest's: 1.0 = balanced; lower = ranks wait for a straggler."""
    rates = [s.images_per_s for s in summaries]
    if not rates or max(rates) <= 0:
        return 1.0
    return min(rates) / max(rates)


def global_images_per_s(summaries: Sequence[RankSummary]) -> float:
    """All ranks' images over the longest rank's wall time."""
    wall = max((s.wall_s for s in summaries), default=0.0)
    return sum(s.images for s in summaries) / wall if wall > 0 else sum(s.images_per_s for s in summaries)


def format_rank_table(summaries: Sequence[RankSummary]) -> str:
    """One row per rank (images/s, data-wait %, step p50/p95), then global images/s and the balance."""
    header = f"{'rank':>4}  {'images/s':>9}  {'data-wait %':>11}  {'step p50 ms':>11}  {'step p95 ms':>11}  {'steps':>6}  {'images':>7}"
    rows = [header]
    for s in summaries:
        rows.append(
            f"{s.rank:>4}  {s.images_per_s:>9.1f}  {100 * s.data_wait_frac:>11.1f}  "
            f"{1000 * s.step_p50_s:>11.1f}  {1000 * s.step_p95_s:>11.1f}  {s.steps:>6}  {s.images:>7}"
        )
    rows.append(
        f"global: {global_images_per_s(summaries):.1f} images/s over {len(summaries)} rank(s); "
        f"load balance (slowest/fastest images/s): {imbalance(summaries):.2f}"
    )
    return "\n".join(rows)


class JsonlWriter:
    """Append one JSON object per line; each line is one ``write`` on an O_APPEND file. Rank 0 only."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = (json.dumps(record, sort_keys=True, default=_jsonable) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if os.write(fd, line) != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a short append: the file system is full
            finally:
                os.close(fd)
        except OSError as e:
            raise TrainError(
                f"{self.path}: cannot write metrics: {describe(e, writing=True)}, or set output.dir to another file system"
            ) from None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return str(value)
