"""What one rank measured: per-step stage times and their summaries (shared by verdict and report).

Stages of a step, in seconds: ``wait`` (blocked in ``next(loader)``, less ``collate``), the loader
workers' ``read`` and ``decode`` (worker time for the whole batch), then on the rank ``collate``
(the loader's own work on the batch), ``h2d``, ``compute`` and ``sync``; see
:mod:`imgpipe.bench.probes` for where each is timed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from imgpipe.train.metrics import RankSummary, StepRecord, summarize

STAGES = ("read", "decode", "collate", "h2d", "compute", "sync")
LOADER_STAGES = ("read", "decode")  # inside the loader's workers; unknown for DALI


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

    @property
    def total(self) -> float:
        """The step's wall time: read and decode happen in the workers, inside ``wait`` or overlapped."""
        return self.wait + self.collate + self.h2d + self.compute + self.sync


@dataclass
class RankStats:
    """What one rank measured in one (backend, workers) run.

    ``timed_stages`` is False when the loader reads and decodes internally (DALI): those
    stages are then unknown, not zero.
    """

    rank: int
    batch_size: int
    timed_stages: bool = True
    steps: list[StepTimes] = field(default_factory=list)

    def summary(self) -> RankSummary:
        """images/s, data-wait fraction and step percentiles, as the trainer reports them."""
        records = [StepRecord(s.wait, s.total - s.wait, self.batch_size) for s in self.steps]
        return summarize(records, self.rank)

    def stage_ms(self) -> dict[str, float | None]:
        """Mean milliseconds per batch of each stage (read and decode are worker time); None if unknown."""
        means: dict[str, float | None] = {}
        for name in STAGES:
            untimed = not self.steps or (not self.timed_stages and name in LOADER_STAGES)
            means[name] = None if untimed else 1000 * float(np.mean([getattr(s, name) for s in self.steps]))
        return means

    @property
    def own_images_per_s(self) -> float:
        """images/s without the time spent waiting for other ranks: this rank's speed alone."""
        own = sum(s.total - s.sync for s in self.steps)
        return self.batch_size * len(self.steps) / own if own > 0 else 0.0
