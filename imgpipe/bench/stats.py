"""What one rank measured: per-step phase times and their summaries (shared by verdict and report).

Phases of a step, in seconds: ``wait`` (blocked in ``next(loader)``, less ``collate``), the loader
workers' ``read`` and ``decode`` (worker time for the whole batch), then on the rank ``collate``
(the loader's own work on the batch), ``h2d``, ``compute`` and ``sync``; see
:mod:`imgpipe.bench.probes` for where each is timed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from imgpipe.train.metrics import RankSummary, StepRecord, summarize

PHASES = ("read", "decode", "collate", "h2d", "compute", "sync")
LOADER_PHASES = ("read", "decode")  # inside the loader's workers; unknown for DALI


@dataclass
class StepTimes:
    """One measured step of one rank, in seconds; ``start`` counts from the first measured step
    (the ranks start it together, at a barrier)."""

    start: float
    wait: float
    read: float = 0.0
    decode: float = 0.0
    collate: float = 0.0
    h2d: float = 0.0
    compute: float = 0.0
    sync: float = 0.0
    requests: int = 0  # HTTP requests the loader's workers made to a remote store for this batch
    request_calls: int = 0
    request_s: float = 0.0
    fetched_bytes: int = 0

    @property
    def total(self) -> float:
        """The step's wall time: read and decode happen in the workers, inside ``wait`` or overlapped."""
        return self.wait + self.collate + self.h2d + self.compute + self.sync


@dataclass
class RankStats:
    """What one rank measured in one (backend, workers) run.

    ``timed_phases`` is False when the loader reads and decodes internally (DALI): those
    phases are then unknown, not zero.
    """

    rank: int
    batch_size: int
    timed_phases: bool = True
    steps: list[StepTimes] = field(default_factory=list)

    def summary(self) -> RankSummary:
        """images/s, data-wait fraction and step percentiles, as the trainer reports them."""
        records = [StepRecord(s.wait, s.total - s.wait, self.batch_size) for s in self.steps]
        return summarize(records, self.rank)

    def phase_ms(self) -> dict[str, float | None]:
        """Mean milliseconds per batch of each phase (read and decode are worker time); None if unknown."""
        means: dict[str, float | None] = {}
        for name in PHASES:
            untimed = not self.steps or (not self.timed_phases and name in LOADER_PHASES)
            means[name] = None if untimed else 1000 * float(np.mean([getattr(s, name) for s in self.steps]))
        return means

    @property
    def own_images_per_s(self) -> float:
        """images/s without the time spent waiting for other ranks: this rank's speed alone."""
        own = sum(s.total - s.sync for s in self.steps)
        return self.batch_size * len(self.steps) / own if own > 0 else 0.0


@dataclass(frozen=True)
class StoreIO:
    """What the loaders of a run asked of a remote store during the measured steps, all ranks together."""

    requests: int  # HTTP requests (ranges of one file closer than 256 KiB share one)
    calls: int  # the calls they were made in: one per file and batch, its requests concurrent
    request_s: float  # the seconds those calls took, summed
    fetched_bytes: int
    seconds: float  # the measured time (the ranks run at once)

    @property
    def latency_ms(self) -> float:
        """Mean time from asking for a batch's ranges of one file to having them all."""
        return 1000 * self.request_s / self.calls if self.calls else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.fetched_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"requests": self.requests, "calls": self.calls, "latency_ms": self.latency_ms, "requests_per_s": self.requests_per_s,
                "mb_per_s": self.mb_per_s, "bytes": self.fetched_bytes, "seconds": self.seconds}  # fmt: skip


def store_io(ranks: list[RankStats]) -> StoreIO | None:
    """The ranks' remote-store requests during their measured steps; None when they made none (a local folder,
    or DALI, whose reads are not timed)."""
    steps = [s for r in ranks for s in r.steps]
    calls = sum(s.request_calls for s in steps)
    if not calls:
        return None
    seconds = max(sum(s.total for s in r.steps) for r in ranks)
    return StoreIO(sum(s.requests for s in steps), calls, sum(s.request_s for s in steps), sum(s.fetched_bytes for s in steps), seconds)
