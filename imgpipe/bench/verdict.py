"""The verdict: which bound a bench run hit, its evidence and what to change next, as data (``findings``).

The run judged is the fastest one (the best backend and worker count). The rules, in order: a
straggler (a rank whose own reads or decodes are slower, not one that merely waited longer), input
bound (remote I/O, I/O or decode, each with its next action; without phase times, as with DALI, only
what holds either way), else compute bound with the loader's
headroom; observations add what the rules do not decide. Every threshold is a field of ``Thresholds``;
the rules in full are in docs/bench-json.md ("How the verdict is reached"); ``wording`` says it in words.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from imgpipe.bench import wording
from imgpipe.bench.findings import (
    THRESHOLDS,
    Action,
    AddCpus,
    ArrivedLast,
    BestRun,
    Bound,
    BuildRegionDecoder,
    Cause,
    CheckRankDisk,
    CheckRankNetwork,
    ComputeEvidence,
    DaliReadsUntimed,
    Evidence,
    GiveRankCpu,
    IoEvidence,
    KeepDataLocal,
    LoaderMs,
    LoaderOnly,
    MoreReadsInFlight,
    Observation,
    PackResized,
    PackToSsd,
    RaisePrefetch,
    RaiseWorkers,
    RemoteEvidence,
    StragglerEvidence,
    UseDali,
    WarmCache,
)
from imgpipe.bench.runner import BenchResult, RunResult
from imgpipe.bench.system import describe_disk
from imgpipe.storage.source import is_url


@dataclass
class Verdict:
    """The ``bound`` of the judged run (``backend`` with ``workers``), the ``evidence`` it rests on, the
    ``actions`` to take and the ``observations`` the rules do not decide; ``message`` and ``notes`` word them."""

    bound: Bound
    backend: str
    workers: int
    evidence: Evidence
    actions: tuple[Action, ...] = ()
    observations: list[Observation] = field(default_factory=list)
    straggler: int | None = None
    cause: Cause | None = None

    @property
    def message(self) -> str:
        """The one-line verdict with its next action."""
        return wording.message(self.bound, self.evidence, self.actions)

    @property
    def notes(self) -> list[str]:
        return [wording.note(observation) for observation in self.observations]

    def to_dict(self) -> dict[str, Any]:
        """bench.json's ``verdict`` (docs/bench-json.md): the words, and the data they say."""
        return {
            "bound": self.bound.value,
            "message": self.message,
            "backend": self.backend,
            "workers": self.workers,
            "straggler": self.straggler,
            "cause": None if self.cause is None else self.cause.value,
            "notes": self.notes,
            "evidence": _plain(self.evidence),
            "actions": [{"action": act.kind, **_plain(act)} for act in self.actions],
        }


JSON_KEYS = {"phase": "stage", "phase_ms": "stage_ms"}  # the keys bench.json (schema 1) was published with


def _plain(value: Any) -> Any:
    """A dataclass of findings as JSON values (named tuples and nested dataclasses as objects)."""
    if isinstance(value, LoaderMs):
        return value._asdict()
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        return {JSON_KEYS.get(f.name, f.name): _plain(getattr(value, f.name)) for f in fields(value)}
    return value


def decide(result: BenchResult) -> Verdict:
    """Apply the rules (docs/bench-json.md, "How the verdict is reached") to the fastest run of ``result``."""
    run = result.best_run
    verdict = _straggler(result, run) or _input_bound(result, run) or _compute_bound(run)
    uneven = _uneven_waits(run)
    if uneven is not None and verdict.bound != Bound.STRAGGLER:
        verdict.observations.append(ArrivedLast(run.ranks[uneven[0]].rank, uneven[1], uneven[2]))
    verdict.observations.extend(_observations(result, run, verdict.bound))
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


def _high_iowait(run: RunResult) -> float | None:
    """System iowait when it is at least ``iowait_high_pct`` (then it is evidence), else None."""
    iowait = _iowait(run)
    return iowait if iowait is not None and iowait >= THRESHOLDS.iowait_high_pct else None


def _slow_phase(phases: list[dict[str, float | None]], rank: int) -> tuple[str, float, float] | None:
    """(phase, its ms, the others' median ms) of ``rank``'s first loader phase that is ``slow_phase_ratio`` x slower."""
    for phase in ("read", "decode"):
        mine = phases[rank][phase]
        rest = [p[phase] for i, p in enumerate(phases) if i != rank]
        if mine is None or any(v is None for v in rest):
            continue
        typical = max(statistics.median(rest), THRESHOLDS.min_phase_ms)
        if mine >= THRESHOLDS.slow_phase_ratio * typical:
            return phase, mine, typical
    return None


def _uneven_waits(run: RunResult) -> tuple[int, float, float] | None:
    """(rank, its wait, the others' highest) when one rank waits for data clearly more than the rest."""
    if len(run.ranks) < 2:
        return None
    waits = _waits(run)
    slow = max(range(len(waits)), key=waits.__getitem__)
    others = max(w for r, w in enumerate(waits) if r != slow)
    if waits[slow] - others < THRESHOLDS.straggler_wait_gap or others >= THRESHOLDS.data_bound_wait:
        return None  # no outlier, or every rank starves: the input-bound rules say why
    return slow, waits[slow], others


def _straggler(result: BenchResult, run: RunResult) -> Verdict | None:
    uneven = _uneven_waits(run)
    if uneven is None:
        return None
    slow, wait, others = uneven
    found = _slow_phase([r.phase_ms() for r in run.ranks], slow)
    if found is None:
        return None  # it waited longer, but its own loader is no slower: an ArrivedLast observation
    phase, mine, typical = found
    rank = run.ranks[slow].rank
    cause = Cause.IO if phase == "read" else Cause.DECODE
    data = str(result.config.data)
    act: Action
    if cause == Cause.DECODE:
        act = GiveRankCpu(rank)
    elif is_url(data):
        act = CheckRankNetwork(rank, data)
    elif result.disk.rotational or result.disk.network:
        act = PackToSsd(data)
    else:
        act = CheckRankDisk(rank)
    evidence = StragglerEvidence(
        data_wait=job_wait(run),
        loader_ms=_loader_ms(run),
        rank=rank,
        wait=wait,
        others_wait=others,
        phase=phase,
        phase_ms=mine,
        others_ms=typical,
        iowait_pct=_high_iowait(run) if cause == Cause.IO else None,
        disk=describe_disk(result.disk),
    )
    return Verdict(Bound.STRAGGLER, run.backend, run.workers, evidence, (act,), straggler=rank, cause=cause)


def _loader_ms(run: RunResult) -> LoaderMs | None:
    """Mean (read, decode, consume) ms per batch over the ranks; None without phase times."""
    phases = [r.phase_ms() for r in run.ranks]
    if any(p["read"] is None for p in phases):
        return None
    return LoaderMs(
        read=statistics.mean(p["read"] for p in phases),
        decode=statistics.mean(p["decode"] for p in phases),
        consume=statistics.mean(p["collate"] + p["h2d"] + p["compute"] for p in phases),
    )


def _input_bound(result: BenchResult, run: RunResult) -> Verdict | None:
    wait = job_wait(run)
    if wait < THRESHOLDS.data_bound_wait:
        return None
    loader = _loader_ms(run)
    read_share = loader.read_share if loader else None
    reads_dominate = read_share is not None and read_share >= THRESHOLDS.read_share_io
    data = str(result.config.data)
    if is_url(data):
        if reads_dominate:
            return _remote_bound(result, run, wait, loader)
    else:
        iowait = _high_iowait(run)
        if iowait is not None or reads_dominate:
            slow_disk = bool(result.disk.rotational) or result.disk.network
            evidence = IoEvidence(wait, loader, describe_disk(result.disk), iowait, None if iowait is not None else read_share)
            act = PackToSsd(data) if slow_disk else MoreReadsInFlight()
            return Verdict(Bound.IO, run.backend, run.workers, evidence, (act,), cause=Cause.IO)
    if loader is None:
        return _untimed_input_bound(result, run, wait)
    return _decode_bound(result, run, wait, loader)


def _more_workers(result: BenchResult, run: RunResult, loader: LoaderMs | None) -> Action:
    """More workers (how many, where the loader's times say), or more CPUs where a run with more workers was slower."""
    tried = _more_workers_tried(result, run)
    if tried is not None:
        return AddCpus(tried.workers, tried.images_per_s, run.workers, run.images_per_s, result.cpus)
    target = _workers_needed(run, loader)
    cores = max(1, result.cpus // max(1, len(run.ranks)))
    return RaiseWorkers(target, cores if target is not None and target > cores else None)


def _decode_bound(result: BenchResult, run: RunResult, wait: float, loader: LoaderMs) -> Verdict:
    actions: list[Action] = [_more_workers(result, run, loader)] + ([UseDali()] if run.backend != "dali" else []) + [PackResized()]
    if run.backend == "torch" and not result.region_decoder:
        actions.insert(0, BuildRegionDecoder())
    return Verdict(Bound.DECODE, run.backend, run.workers, Evidence(wait, loader), tuple(actions), cause=Cause.DECODE)


def _untimed_input_bound(result: BenchResult, run: RunResult, wait: float) -> Verdict:
    """Input bound with no phase times (DALI): reading and decoding cannot be told apart, so only the
    actions that help either: the data on the node (from a URL), more workers, smaller images."""
    data = str(result.config.data)
    actions = ([KeepDataLocal(data)] if is_url(data) else []) + [_more_workers(result, run, None), PackResized()]
    return Verdict(Bound.INPUT, run.backend, run.workers, Evidence(wait, None), tuple(actions))


def _remote_bound(result: BenchResult, run: RunResult, wait: float, loader: LoaderMs) -> Verdict:
    """The loader waits for the store: what the store did, and how to stop waiting for it."""
    data = str(result.config.data)
    io = run.store_io
    request_mb_s = io.fetched_bytes / io.request_s / 1e6 if io is not None and io.request_s > 0 else None
    evidence = RemoteEvidence(wait, loader, data, loader.read_share or 0.0, io, request_mb_s)
    actions: list[Action] = [KeepDataLocal(data), RaiseWorkers(_workers_needed(run, loader))]
    prefetch = _deeper_prefetch(result, evidence)
    if prefetch is not None:
        actions.append(prefetch)
    return Verdict(Bound.REMOTE, run.backend, run.workers, evidence, tuple(actions), cause=Cause.REMOTE_IO)


def _deeper_prefetch(result: BenchResult, evidence: RemoteEvidence) -> RaisePrefetch | None:
    """The prefetch advice of rule 2 (remote), or None where it does not apply."""
    io, loader = evidence.store, evidence.loader_ms
    if io is None or loader is None or evidence.request_mb_s is None:
        return None
    if evidence.request_mb_s >= THRESHOLDS.latency_bound_mb_s:
        return None  # bandwidth bounds the requests: more of them in flight only queue
    # the decoded batches a round trip lasts
    ahead = min(THRESHOLDS.max_batches_ahead, math.ceil(round(io.latency_ms / max(loader.decode, THRESHOLDS.min_phase_ms), 6)))
    if ahead + 1 <= result.config.train_config().data.prefetch_factor:
        return None  # the batches fetched ahead already cover a round trip
    return RaisePrefetch(ahead + 1)


def _more_workers_tried(result: BenchResult, run: RunResult) -> RunResult | None:
    """The run of ``run``'s backend with the most workers beyond ``run``'s, if one was measured.

    ``run`` is the fastest, so that run was no faster: more workers did not help on these cores.
    """
    more = [r for r in result.runs if r.backend == run.backend and r.workers > run.workers]
    return max(more, key=lambda r: r.workers) if more else None


def _workers_needed(run: RunResult, loader: LoaderMs | None) -> int | None:
    """Workers that produce one batch per compute step: ceil(loader ms / compute ms).

    None when unknown, or when the rank spends under ``min_consume_ms`` per batch (a loader-only
    run): no worker count keeps up with a step that takes no time.
    """
    if loader is None or loader.consume < THRESHOLDS.min_consume_ms:
        return None
    return max(run.workers + 1, math.ceil(loader.work / loader.consume))


def _compute_bound(run: RunResult) -> Verdict:
    loader = _loader_ms(run)
    headroom = max(run.workers, 1) * loader.consume / loader.work - 1 if loader is not None and loader.work > 0 else None
    return Verdict(Bound.COMPUTE, run.backend, run.workers, ComputeEvidence(job_wait(run), loader, headroom))


def _observations(result: BenchResult, run: RunResult, bound: Bound) -> list[Observation]:
    found: list[Observation] = []
    if not result.config.model and not result.config.compute_ms:
        found.append(LoaderOnly())
    if run.resident_before is not None and run.resident_before >= THRESHOLDS.warm_cache and not result.config.cold:
        found.append(WarmCache(run.resident_before))
    if is_url(result.config.data) and not any(r.timed_phases for r in run.ranks) and bound != Bound.INPUT:  # INPUT's message says it
        found.append(DaliReadsUntimed())
    if len({r.workers for r in result.runs}) > 1:
        for backend in sorted({r.backend for r in result.runs}):
            best = result.best(backend)
            if best is not None:
                found.append(BestRun(backend, best.workers, best.images_per_s))
    return found
