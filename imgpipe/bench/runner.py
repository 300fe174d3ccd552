"""Run the bench: N ranks, each driving its own part of DATA through a loader, for every
(backend, workers) pair, with real or simulated compute, while the system is sampled.

Ranks are started by the trainer's launcher (:func:`imgpipe.train.launch.launch`) and run the runs in
the same order: before each, rank 0 evicts DATA from the page cache (``--cold``) and measures its
residency, each rank warms its loader up, and all start measuring together at a barrier; rank 0
gathers the results. A step is ``wait`` -> ``h2d`` -> ``compute`` -> ``sync`` (:mod:`.compute`), each
ending on a :class:`~.clock.PhaseClock` reading; the loaders are the real ones (:mod:`.probes`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.diskinfo import DiskInfo, device_for_path
from imgpipe.bench import cache
from imgpipe.bench.clock import PhaseClock
from imgpipe.bench.compute import Compute, trainer_cudnn
from imgpipe.bench.config import BACKENDS, BenchConfig
from imgpipe.bench.stats import RankStats, StepTimes, StoreIO, store_io
from imgpipe.bench.system import SystemSampler, SystemSummary, diskstats_name, summarize
from imgpipe.errors import ConfigError
from imgpipe.format.shardset import ShardSet, open_shardset
from imgpipe.loaders.phase_timer import BatchTimes, PhaseTimer
from imgpipe.loaders.pixels import region_decoder
from imgpipe.storage.source import url_scheme
from imgpipe.train.metrics import gather_objects

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """One (backend, workers) run: every rank's steps and the system during the run."""

    backend: str
    workers: int
    ranks: list[RankStats]
    start: float
    end: float
    resident_before: float | None
    system: SystemSummary | None = None

    @property
    def images_per_s(self) -> float:
        """All ranks together."""
        return sum(r.summary().images_per_s for r in self.ranks)

    @property
    def store_io(self) -> StoreIO | None:
        """What the loaders asked of a remote store (DATA at a URL, torch backend), or None."""
        return store_io(self.ranks)

    @property
    def imbalance(self) -> float:
        """Slowest rank's own images/s (without waiting for the others) over the fastest's; 1.0 = balanced."""
        rates = [r.own_images_per_s for r in self.ranks]
        return min(rates) / max(rates) if rates and max(rates) > 0 else 1.0


@dataclass
class BenchResult:
    """Everything one ``imgpipe bench`` measured."""

    config: BenchConfig
    disk: DiskInfo
    records: int
    data_bytes: int
    cpus: int
    device: str
    runs: list[RunResult] = field(default_factory=list)
    region_decoder: bool = True  # the torch loader decodes only each crop (``imgpipe.image._jpeg_region`` was built)

    def best(self, backend: str) -> RunResult | None:
        """The fastest run of ``backend`` (its best worker count)."""
        runs = [r for r in self.runs if r.backend == backend]
        return max(runs, key=lambda r: r.images_per_s) if runs else None

    @property
    def best_run(self) -> RunResult:
        return max(self.runs, key=lambda r: r.images_per_s)


def resolve_backends(choice: str) -> tuple[str, ...]:
    """``torch``, ``dali`` or ``all`` -> the backends to run; DALI must be importable when asked for."""
    from imgpipe.loaders.dali import INSTALL_HINT, dali_available

    if choice == "all":
        if dali_available():
            return BACKENDS
        logger.warning("DALI is not installed: benchmarking the torch backend only (%s)", INSTALL_HINT)
        return ("torch",)
    if choice == "dali" and not dali_available():
        raise ConfigError(f"--backend dali needs NVIDIA DALI: {INSTALL_HINT}, or use --backend torch")
    return (choice,)  # BenchConfig.check refuses anything but BACKENDS


def shard_files(shards: ShardSet) -> list[Path]:
    """The local .rec and .idx files the bench reads (what --cold evicts); none for a URL."""
    if shards.byte_source.remote:
        return []
    return [p for rec in shards.rec_paths for p in (rec, rec.with_suffix(".idx")) if p.is_file()]


def data_disk(data: str) -> DiskInfo:
    """Where DATA lives: its disk, or for a URL its store, as a network filesystem named by the scheme."""
    scheme = url_scheme(data)
    if scheme is not None:
        return DiskInfo(device="", mountpoint=data, fstype=scheme, rotational=None, network=True)
    return device_for_path(data)


def run_bench(config: BenchConfig) -> BenchResult | None:
    """Run every (backend, workers) pair on ``config.ranks`` ranks and return the measurements.

    Under torchrun or SLURM this process is one of the ranks: rank 0 gets the result, the others None.
    """
    config.check()
    _check_gpus(config)
    from imgpipe.train.launch import launch

    shards = open_shardset(config.data, config.split)  # a bad DATA fails here, in one line
    if len(shards) < config.batch_size * config.ranks:
        raise ConfigError(
            f"{config.data}: split {config.split!r} has {len(shards)} records, not one batch of {config.batch_size} "
            f"for each of {config.ranks} rank(s); lower --batch-size"
        )
    disk = data_disk(config.data)
    result = BenchResult(
        config=config,
        disk=disk,
        records=len(shards),
        data_bytes=shards.data_bytes,
        cpus=available_cpus(),
        device="cuda" if config.gpus else "cpu",
        region_decoder=region_decoder() is not None,
    )
    logger.info(
        "bench: %d rank(s), %s, workers %s, %d steps of %d on %s",
        config.ranks,
        "/".join(config.backends),
        ",".join(map(str, config.workers)),
        config.steps,
        config.batch_size,
        config.data,
    )
    with SystemSampler() as sampler:
        runs = launch(bench_rank, config, gpus=config.gpus, nproc=config.nproc if not config.gpus else None)
    if runs is None:
        return None
    device = diskstats_name(disk, config.data)
    for run in runs:
        run.system = summarize(sampler.samples, device, run.start, run.end)
    result.runs = runs
    return result


def _check_gpus(config: BenchConfig) -> None:
    if not config.gpus:
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"--gpus {config.gpus} needs CUDA but torch sees no GPU; run the ranks on the CPU with --gpus 0 --nproc {config.gpus}"
        )


# ----------------------------------------------------------------------------- on each rank


def bench_rank(ctx: Any, config: BenchConfig) -> list[RunResult] | None:
    """One rank: every run in order; returns all ranks' results on rank 0, None elsewhere."""
    import torch

    if ctx.device.type == "cpu" and ctx.world_size > 1:  # ranks share the cores
        torch.set_num_threads(max(1, available_cpus() // ctx.world_size))
    shards = open_shardset(config.data, config.split)
    files = shard_files(shards) if ctx.is_main else []  # only rank 0 evicts and measures the page cache
    compute = Compute(config, ctx, len(shards.classes or []) or 1000)
    runs: list[RunResult] = []
    with trainer_cudnn(config.train_config(), ctx.device):
        _run_all(ctx, config, compute, files, runs)
    return runs if ctx.is_main else None


def _run_all(ctx: Any, config: BenchConfig, compute: Compute, files: list[Path], runs: list[RunResult]) -> None:
    """Every (backend, workers) run in order; rank 0 appends the gathered results to ``runs``."""
    for backend in config.backends:
        for workers in config.workers:
            resident = None
            if ctx.is_main:
                if config.cold:
                    cache.evict(files)
                resident = cache.resident_fraction(files)
            _barrier(ctx)
            start = time.time()
            stats = _run_one(ctx, config, backend, workers, compute)
            gathered = gather_objects(stats)
            if ctx.is_main:
                runs.append(RunResult(backend, workers, gathered, start, time.time(), resident))
                logger.info("%s, %d worker(s): %.1f images/s", backend, workers, runs[-1].images_per_s)


def _run_one(ctx: Any, config: BenchConfig, backend: str, workers: int, compute: Compute) -> RankStats:
    """Warm up, line the ranks up at a barrier, then measure ``config.steps`` steps."""
    from imgpipe.bench.probes import endless, make_loader

    stats = RankStats(ctx.rank, config.batch_size, timed_phases=backend == "torch")
    timer = PhaseTimer() if backend == "torch" else None
    loader = make_loader(backend, config.train_config(workers, ctx.device), ctx, timer)
    clock = PhaseClock(ctx.device)
    try:
        iterator = endless(loader)
        warm_start = time.perf_counter()
        for _ in range(config.warmup):
            _step(iterator, compute, clock, timer, 0.0)
        logger.debug("rank %d: %s with %d workers warmed up in %.1fs", ctx.rank, backend, workers, time.perf_counter() - warm_start)
        _barrier(ctx)
        origin = time.perf_counter()
        stats.steps = [_step(iterator, compute, clock, timer, origin) for _ in range(config.steps)]
    finally:
        loader.close()
    return stats


def _step(iterator: Iterator[tuple[Any, Any]], compute: Compute, clock: PhaseClock, timer: PhaseTimer | None, origin: float) -> StepTimes:
    """One training step, timed phase by phase; ``start`` is relative to ``origin``.

    The phases add up to the step's wall time: the loader's ``collate`` happens inside ``next()``
    and is taken out of ``wait``. (On a GPU the torch loader prepares the next batch inside that
    call; the collate taken out is the previous batch's, the same on average.)
    """
    t0 = clock.now()
    images, labels = next(iterator)
    t1 = time.perf_counter()
    t2 = clock.now()  # the copy to the device, as far as this step still waits for it
    loader = timer.take() if timer is not None else BatchTimes()
    compute.step(images, labels)
    t3 = clock.now()
    compute.sync()
    t4 = clock.now()
    compute.update()
    t5 = clock.now()
    wait = max(0.0, t1 - t0 - loader.collate)
    return StepTimes(
        t0 - origin,
        wait,
        loader.read,
        loader.decode,
        loader.collate,
        t2 - t1,
        (t3 - t2) + (t5 - t4),
        t4 - t3,
        loader.requests,
        loader.request_calls,
        loader.request_s,
        loader.fetched_bytes,
    )


def _barrier(ctx: Any) -> None:
    if ctx.distributed:
        import torch.distributed as dist

        dist.barrier()
