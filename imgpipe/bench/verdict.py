"""The verdict: which bound a bench run hit, in plain words, and what to change next.

The run judged is the fastest one (the best backend and worker count). The rules, in order: a
straggler (a rank whose own reads or decodes are slower, not one that merely waited longer), input
bound (remote I/O, I/O or decode, each with its next action), else compute bound with the loader's
headroom; notes add what the rules do not decide. Every threshold is a named constant below; the
rules in full are in docs/bench-json.md ("How the verdict is reached").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from imgpipe.bench.runner import BenchResult, RunResult
from imgpipe.bench.stats import StoreIO
from imgpipe.bench.system import describe_disk
from imgpipe.loaders.pixels import REGION_DECODER_HEADERS
from imgpipe.storage.objectstore import FETCH_THREADS
from imgpipe.storage.source import is_url

DATA_BOUND_WAIT = 0.20
MIN_CONSUME_MS = 1.0  # a rank's own time per batch below this: too small to size workers from
STRAGGLER_WAIT_GAP = 0.15
SLOW_STAGE_RATIO = 3.0
IOWAIT_HIGH_PCT = 20.0
READ_SHARE_IO = 0.5
WARM_CACHE = 0.9
MIN_STAGE_MS = 0.05  # stage times below this are noise: a floor for the ratios
MAX_HEADROOM_SHOWN = 10.0  # beyond 1000 % the exact figure says nothing more
LATENCY_BOUND_MB_S = 20.0  # a store request bringing its bytes slower than this waits on round trips, not on bandwidth
MAX_BATCHES_AHEAD = FETCH_THREADS - 1  # a process fetches at most this many batches ahead of the one it reads

BOUNDS = ("io", "remote", "decode", "compute", "straggler")


@dataclass
class Verdict:
    """``bound`` is one of BOUNDS; ``message`` is the one-line verdict with its next action."""

    bound: str
    message: str
    backend: str
    workers: int
    straggler: int | None = None
    cause: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plural(count: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.0f} %"


def decide(result: BenchResult) -> Verdict:
    """Apply the rules (docs/bench-json.md, "How the verdict is reached") to the fastest run of ``result``."""
    run = result.best_run
    verdict = _straggler(result, run) or _input_bound(result, run) or _compute_bound(result, run)
    uneven = _uneven_waits(run)
    if uneven is not None and verdict.bound != "straggler":
        rank, wait, others = run.ranks[uneven[0]].rank, uneven[1], uneven[2]
        verdict.notes.append(
            f"rank {rank} waited for data {_pct(wait)} of the time against {_pct(others)} on the others, but its own "
            "read and decode are no slower (or unknown): it arrived last at the all-reduce, not a straggler"
        )
    verdict.notes.extend(_notes(result, run))
    return verdict


def _waits(run: RunResult) -> list[float]:
    return [r.summary().data_wait_frac for r in run.ranks]


def job_wait(run: RunResult) -> float:
    """Fraction of the job's time spent waiting for data: per step, the longest wait of any rank.

    Ranks step together (the all-reduce), so a step lasts as long as its most-starved rank's
    wait plus the work; who waited in ``next(loader)`` and who in the all-reduce varies from step
    to step when the ranks share one bottleneck, so no single rank's mean measures the job.
    """
    steps = list(zip(*(r.steps for r in run.ranks)))
    total = sum(max(s.total for s in step) for step in steps)
    return sum(max(s.wait for s in step) for step in steps) / total if total > 0 else 0.0


def _iowait(run: RunResult) -> float | None:
    return run.system.iowait_pct if run.system else None


def _slow_stage(stages: list[dict[str, float | None]], rank: int) -> tuple[str, float, float] | None:
    """(stage, its ms, the others' median ms) of ``rank``'s first loader stage that is ``SLOW_STAGE_RATIO`` x slower."""
    for stage in ("read", "decode"):
        mine = stages[rank][stage]
        rest = [s[stage] for i, s in enumerate(stages) if i != rank]
        if mine is None or any(v is None for v in rest):
            continue
        typical = max(statistics.median(rest), MIN_STAGE_MS)
        if mine >= SLOW_STAGE_RATIO * typical:
            return stage, mine, typical
    return None


def _uneven_waits(run: RunResult) -> tuple[int, float, float] | None:
    """(rank, its wait, the others' highest) when one rank waits for data clearly more than the rest."""
    if len(run.ranks) < 2:
        return None
    waits = _waits(run)
    slow = max(range(len(waits)), key=waits.__getitem__)
    others = max(w for r, w in enumerate(waits) if r != slow)
    if waits[slow] - others < STRAGGLER_WAIT_GAP or others >= DATA_BOUND_WAIT:
        return None  # no outlier, or every rank starves: the input-bound rules say why
    return slow, waits[slow], others


def _straggler(result: BenchResult, run: RunResult) -> Verdict | None:
    uneven = _uneven_waits(run)
    if uneven is None:
        return None
    slow, wait, others = uneven
    found = _slow_stage([r.stage_ms() for r in run.ranks], slow)
    if found is None:
        return None  # it waited longer, but its own loader is no slower: see _notes
    stage, mine, typical = found
    rank = run.ranks[slow].rank
    cause = "I/O" if stage == "read" else "decode"
    verb = "reading its records" if stage == "read" else "decoding its images"
    detail = f"; {cause} cause: {verb} takes {mine:.1f} ms per batch against {typical:.1f} ms on the others"
    iowait = _iowait(run)
    if cause == "I/O" and iowait is not None and iowait >= IOWAIT_HIGH_PCT:
        detail += f" ({iowait:.0f} % iowait on {describe_disk(result.disk)})"
    if cause == "decode":
        action = f"give rank {rank} more CPU (other processes on its cores?) or more workers"
    elif is_url(result.config.data):
        action = (
            f"check rank {rank}'s network path to the store, or keep the data on its node ({_LOCAL_COPY.format(data=result.config.data)})"
        )
    elif result.disk.rotational or result.disk.network:
        action = f"pack to an SSD with `imgpipe pack SRC /ssd/imagenet` (or copy {result.config.data} there) and bench again"
    else:
        action = f"check the disk that serves rank {rank} (a slow or failing disk, a network mount) and put its data on a local SSD"
    message = (
        f"rank {rank} is a straggler: it waits for data {_pct(wait)} of the time, against {_pct(others)} on the others{detail}; {action}"
    )
    return Verdict("straggler", message, run.backend, run.workers, straggler=rank, cause=cause)


def _loader_ms(run: RunResult) -> tuple[float, float, float] | None:
    """Mean (read, decode, consumer) ms per batch over the ranks; None without stage times.

    read and decode are the workers' time per batch; the consumer is the rank's own work on
    a batch (collate + h2d + compute), the time a worker has to produce the next one.
    """
    stages = [r.stage_ms() for r in run.ranks]
    if any(s["read"] is None for s in stages):
        return None
    read = statistics.mean(s["read"] for s in stages)
    decode = statistics.mean(s["decode"] for s in stages)
    consume = statistics.mean(s["collate"] + s["h2d"] + s["compute"] for s in stages)
    return read, decode, consume


def _input_bound(result: BenchResult, run: RunResult) -> Verdict | None:
    wait = job_wait(run)
    if wait < DATA_BOUND_WAIT:
        return None
    iowait = _iowait(run)
    loader = _loader_ms(run)
    read_share = loader[0] / (loader[0] + loader[1]) if loader and loader[0] + loader[1] > 0 else None
    disk = describe_disk(result.disk)
    slow_disk = bool(result.disk.rotational) or result.disk.network
    remote = is_url(result.config.data)
    if remote and read_share is not None and read_share >= READ_SHARE_IO:
        return _remote_bound(result, run, wait, read_share, loader)
    if not remote and ((iowait is not None and iowait >= IOWAIT_HIGH_PCT) or (read_share is not None and read_share >= READ_SHARE_IO)):
        evidence = (
            f"{iowait:.0f} % iowait"
            if iowait is not None and iowait >= IOWAIT_HIGH_PCT
            else f"reading takes {_pct(read_share or 0)} of the loader's time"
        )
        if slow_disk:
            action = f"pack to an SSD with `imgpipe pack SRC /ssd/imagenet` (or copy {result.config.data} there) and bench again"
        else:
            action = "raise --workers so more reads are in flight, or move DATA to faster storage"
        message = f"I/O bound: {evidence} on {disk}; ranks wait for data {_pct(wait)} of the time; {action}"
        return Verdict("io", message, run.backend, run.workers, cause="I/O")
    target = _workers_needed(run, loader)
    cores = max(1, result.cpus // max(1, len(run.ranks)))
    tried = _more_workers_tried(result, run)
    if tried is not None:
        raise_workers = (
            f"not more workers ({plural(tried.workers, 'worker')} gave {tried.images_per_s:.0f} images/s against "
            f"{run.images_per_s:.0f} with {run.workers}: the {result.cpus} core(s) are busy, add CPUs)"
        )
    elif target is None:
        raise_workers = "raise workers"
    elif target > cores:
        raise_workers = f"raise workers to {target} (more than the {cores} core(s) per rank here: add CPUs)"
    else:
        raise_workers = f"raise workers to {target}"
    options = [raise_workers] + (["use `--backend dali`"] if run.backend != "dali" else []) + ["pack with `--resize 256`"]
    if run.backend == "torch" and not result.region_decoder:
        options.insert(
            0, f"reinstall imgpipe where libjpeg-turbo's headers are ({REGION_DECODER_HEADERS}) so the torch loader decodes only each crop"
        )
    message = (
        f"decode bound: ranks wait for data {_pct(wait)} of the time while decoding dominates the loader; "
        + ", ".join(options[:-1])
        + f", or {options[-1]}"
    )
    return Verdict("decode", message, run.backend, run.workers, cause="decode")


_LOCAL_COPY = (
    "a cache dir (`cache_dir=DIR`, in the trainer `data.cache: DIR`) fills a copy on the node as it streams, or "
    "`imgpipe stage {data} /local/dir` copies it there once (`data.stage: DIR`)"
)


def _remote_bound(
    result: BenchResult, run: RunResult, wait: float, read_share: float, loader: tuple[float, float, float] | None
) -> Verdict:
    """The loader waits for the store: quote what the store did, and how to stop waiting for it."""
    data = result.config.data
    io = run.store_io
    seen = ""
    if io is not None:
        seen = (
            f"; the store answered {io.requests:,} requests, {io.latency_ms:.0f} ms each on average "
            f"({io.requests_per_s:.0f} requests/s, {io.mb_per_s:.1f} MB/s)"
        )
    target = _workers_needed(run, loader)
    more = f"raise --workers to {target}" if target is not None else "raise --workers"
    message = (
        f"remote I/O bound: fetching records from {data} takes {_pct(read_share)} of the loader's time and ranks wait for data "
        f"{_pct(wait)} of the time{seen}; keep the data on each node: {_LOCAL_COPY.format(data=data)}; or {more} "
        "(each worker keeps the requests of its next prefetch_factor - 1 batches in flight)"
    )
    return Verdict("remote", message + _deeper_prefetch(result, io, loader), run.backend, run.workers, cause="remote I/O")


def _deeper_prefetch(result: BenchResult, io: StoreIO | None, loader: tuple[float, float, float] | None) -> str:
    """The prefetch advice of rule 2 (remote), or "" where it does not apply."""
    if io is None or loader is None or io.request_s <= 0:
        return ""
    per_request = io.fetched_bytes / io.request_s / 1e6
    if per_request >= LATENCY_BOUND_MB_S:
        return ""  # bandwidth bounds the requests: more of them in flight only queue
    ahead = min(MAX_BATCHES_AHEAD, math.ceil(round(io.latency_ms / max(loader[1], MIN_STAGE_MS), 6)))  # decoded batches a round trip lasts
    factor = result.config.train_config().data.prefetch_factor
    if ahead + 1 <= factor:
        return ""  # the batches fetched ahead already cover a round trip
    return (
        f"; round trips, not bandwidth, bound the reads ({io.latency_ms:.0f} ms a request, "
        f"{per_request:.1f} MB/s each) and a worker decodes "
        f"a batch in {loader[1]:.0f} ms: raise prefetch_factor to {ahead + 1} (`--set data.prefetch_factor={ahead + 1}`, "
        f"make_torch_loader's prefetch_factor) so each worker fetches {ahead} batches ahead"
    )


def _more_workers_tried(result: BenchResult, run: RunResult) -> RunResult | None:
    """The run of ``run``'s backend with the most workers beyond ``run``'s, if one was measured.

    ``run`` is the fastest, so that run was no faster: more workers did not help on these cores.
    """
    more = [r for r in result.runs if r.backend == run.backend and r.workers > run.workers]
    return max(more, key=lambda r: r.workers) if more else None


def _workers_needed(run: RunResult, loader: tuple[float, float, float] | None) -> int | None:
    """Workers that produce one batch per compute step: ceil(loader ms / compute ms).

    None when unknown, or when the rank spends under ``MIN_CONSUME_MS`` per batch (a loader-only
    run): no worker count keeps up with a step that takes no time.
    """
    if loader is None or loader[2] < MIN_CONSUME_MS:
        return None
    return max(run.workers + 1, math.ceil((loader[0] + loader[1]) / loader[2]))


def _compute_bound(result: BenchResult, run: RunResult) -> Verdict:
    wait = job_wait(run)
    loader = _loader_ms(run)
    if loader is not None and loader[0] + loader[1] > 0:
        headroom = max(run.workers, 1) * loader[2] / (loader[0] + loader[1]) - 1
        shown = f"over {_pct(MAX_HEADROOM_SHOWN)}" if headroom > MAX_HEADROOM_SHOWN else _pct(max(headroom, 0.0))
        message = f"compute bound: the loader has {shown} headroom (ranks wait for data {_pct(wait)} of the time)"
    else:
        message = f"compute bound: the loader keeps up (ranks wait for data {_pct(wait)} of the time)"
    return Verdict("compute", message, run.backend, run.workers)


def _notes(result: BenchResult, run: RunResult) -> list[str]:
    notes = []
    if not result.config.model and not result.config.compute_ms:
        notes.append(
            "loader-only run: with no compute every rank waits for data by construction; "
            "give --model NAME or --compute-ms T to see whether the loader keeps up with your training step"
        )
    if run.resident_before is not None and run.resident_before >= WARM_CACHE and not result.config.cold:
        notes.append(
            f"{_pct(run.resident_before)} of DATA was in the page cache, so the disk was barely read; rerun with --cold to measure the disk"
        )
    if is_url(result.config.data) and not any(r.timed_stages for r in run.ranks):
        notes.append(
            "the DALI loader's reads are not timed, so waiting for the store and decoding cannot "
            "be told apart; `--backend torch` measures both"
        )
    backends = sorted({r.backend for r in result.runs})
    workers = {r.workers for r in result.runs}
    if len(workers) > 1:
        for backend in backends:
            best = result.best(backend)
            if best is not None:
                notes.append(f"best for {backend}: {plural(best.workers, 'worker')}, {best.images_per_s:.0f} images/s")
    return notes
