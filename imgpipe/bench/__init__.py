"""``imgpipe bench``: find the bottleneck of a training input pipeline, rank by rank.

:func:`bench` runs the ranks (:mod:`.runner`) with the real loaders, timed (:mod:`.probes`)
while the system is sampled (:mod:`.system`, :mod:`.cache`), then decides the verdict
(:mod:`.verdict`); :mod:`.report` turns it into a table, JSON and a plot.
"""

from __future__ import annotations

from imgpipe.bench.config import BenchConfig
from imgpipe.bench.runner import BenchResult
from imgpipe.bench.verdict import Verdict


def bench(config: BenchConfig) -> tuple[BenchResult, Verdict] | None:
    """Run the bench described by ``config``; return the measurements and the verdict.

    None on the ranks other than 0 when torchrun or SLURM started this process.
    """
    from imgpipe.bench.runner import run_bench
    from imgpipe.bench.verdict import decide

    result = run_bench(config)
    return None if result is None else (result, decide(result))


__all__ = ["BenchConfig", "BenchResult", "Verdict", "bench"]
