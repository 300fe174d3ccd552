"""The verdict in words, each sentence written once: what the terminal report, bench.json's ``message`` and
``notes`` and the plot's title say."""

from __future__ import annotations

from typing import Callable, Sequence

from imgpipe.bench.findings import (
    THRESHOLDS,
    Action,
    AddCpus,
    ArrivedLast,
    BestRun,
    Bound,
    BuildRegionDecoder,
    CheckRankDisk,
    CheckRankNetwork,
    ComputeEvidence,
    DaliReadsUntimed,
    Evidence,
    GiveRankCpu,
    IoEvidence,
    KeepDataLocal,
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
from imgpipe.image.extensions import INSTALL_FIX


def plural(count: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def pct(fraction: float) -> str:
    return f"{100 * fraction:.0f} %"


def local_copy(data: str) -> str:
    """The two ways to keep a URL's data on the node."""
    return (
        "a cache dir (`cache_dir=DIR`, in the trainer `data.cache: DIR`) fills a copy on the node as it streams, or "
        f"`imgpipe stage {data} /local/dir` copies it there once (`data.stage: DIR`)"
    )


def action(act: Action) -> str:
    """One action as the verdict words it."""
    if isinstance(act, PackToSsd):
        return f"pack to an SSD with `imgpipe pack SRC /ssd/imagenet` (or copy {act.data} there) and bench again"
    if isinstance(act, MoreReadsInFlight):
        return "raise --workers so more reads are in flight, or move DATA to faster storage"
    if isinstance(act, CheckRankDisk):
        return f"check the disk that serves rank {act.rank} (a slow or failing disk, a network mount) and put its data on a local SSD"
    if isinstance(act, CheckRankNetwork):
        return f"check rank {act.rank}'s network path to the store, or keep the data on its node ({local_copy(act.data)})"
    if isinstance(act, GiveRankCpu):
        return f"give rank {act.rank} more CPU (other processes on its cores?) or more workers"
    if isinstance(act, KeepDataLocal):
        return f"keep the data on each node: {local_copy(act.data)}"
    if isinstance(act, RaiseWorkers):
        if act.to is None:
            return "raise --workers"
        beyond = f" (more than the {act.cores_per_rank} core(s) per rank here: add CPUs)" if act.cores_per_rank is not None else ""
        return f"raise --workers to {act.to}{beyond}"
    if isinstance(act, AddCpus):
        return (
            f"not more workers ({plural(act.tried_workers, 'worker')} gave {act.tried_images_per_s:.0f} images/s against "
            f"{act.images_per_s:.0f} with {act.workers}: the {act.cpus} core(s) are busy, add CPUs)"
        )
    if isinstance(act, UseDali):
        return "use `--backend dali`"
    if isinstance(act, PackResized):
        return f"pack with `--resize {act.size}`"
    if isinstance(act, BuildRegionDecoder):
        return f"{INSTALL_FIX}, so the torch loader decodes only each crop"
    if isinstance(act, RaisePrefetch):
        return (
            f"raise prefetch_factor to {act.to} (`--set data.prefetch_factor={act.to}`, make_torch_loader's prefetch_factor) "
            f"so each worker fetches {act.to - 1} batches ahead"
        )
    raise TypeError(f"not an action: {act!r}")


def _straggler(evidence: Evidence, actions: Sequence[Action]) -> str:
    assert isinstance(evidence, StragglerEvidence)
    reading = evidence.phase == "read"
    cause, verb = ("I/O", "reading its records") if reading else ("decode", "decoding its images")
    detail = f"; {cause} cause: {verb} takes {evidence.phase_ms:.1f} ms per batch against {evidence.others_ms:.1f} ms on the others"
    if evidence.iowait_pct is not None:
        detail += f" ({evidence.iowait_pct:.0f} % iowait on {evidence.disk})"
    return (
        f"rank {evidence.rank} is a straggler: it waits for data {pct(evidence.wait)} of the time, against "
        f"{pct(evidence.others_wait)} on the others{detail}; " + "; ".join(map(action, actions))
    )


def _io(evidence: Evidence, actions: Sequence[Action]) -> str:
    assert isinstance(evidence, IoEvidence)
    seen = (
        f"{evidence.iowait_pct:.0f} % iowait"
        if evidence.iowait_pct is not None
        else f"reading takes {pct(evidence.read_share or 0)} of the loader's time"
    )
    return f"I/O bound: {seen} on {evidence.disk}; ranks wait for data {pct(evidence.data_wait)} of the time; " + "; ".join(
        map(action, actions)
    )


def _remote(evidence: Evidence, actions: Sequence[Action]) -> str:
    assert isinstance(evidence, RemoteEvidence)
    io = evidence.store
    seen = (
        f"; the store answered {io.requests:,} requests, {io.latency_ms:.0f} ms each on average "
        f"({io.requests_per_s:.0f} requests/s, {io.mb_per_s:.1f} MB/s)"
        if io is not None
        else ""
    )
    parts = []
    for act in actions:
        if isinstance(act, RaiseWorkers):
            parts.append(f"or {action(act)} (each worker keeps the requests of its next prefetch_factor - 1 batches in flight)")
        elif isinstance(act, RaisePrefetch):
            assert io is not None and evidence.loader_ms is not None
            parts.append(
                f"round trips, not bandwidth, bound the reads ({io.latency_ms:.0f} ms a request, {evidence.request_mb_s:.1f} MB/s each) "
                f"and a worker decodes a batch in {evidence.loader_ms.decode:.0f} ms: {action(act)}"
            )
        else:
            parts.append(action(act))
    return (
        f"remote I/O bound: fetching records from {evidence.data} takes {pct(evidence.read_share)} of the loader's time "
        f"and ranks wait for data {pct(evidence.data_wait)} of the time{seen}; " + "; ".join(parts)
    )


def _decode(evidence: Evidence, actions: Sequence[Action]) -> str:
    options = [action(act) for act in actions]
    return (
        f"decode bound: ranks wait for data {pct(evidence.data_wait)} of the time while decoding dominates the loader; "
        + ", ".join(options[:-1])
        + f", or {options[-1]}"
    )


def _input(evidence: Evidence, actions: Sequence[Action]) -> str:
    return (
        f"input bound: ranks wait for data {pct(evidence.data_wait)} of the time; the DALI loader reads and decodes inside its "
        "pipeline, untimed, so whether reading or decoding holds it back is unknown (`--backend torch` measures both); "
        + "; ".join(map(action, actions))
    )


def _compute(evidence: Evidence, actions: Sequence[Action]) -> str:
    assert isinstance(evidence, ComputeEvidence)
    waiting = f"ranks wait for data {pct(evidence.data_wait)} of the time"
    if evidence.headroom is None:
        return f"compute bound: the loader keeps up ({waiting})"
    most = THRESHOLDS.max_headroom_shown
    shown = f"over {pct(most)}" if evidence.headroom > most else pct(max(evidence.headroom, 0.0))
    return f"compute bound: the loader has {shown} headroom ({waiting})"


_MESSAGES: dict[Bound, Callable[[Evidence, Sequence[Action]], str]] = {
    Bound.STRAGGLER: _straggler,
    Bound.IO: _io,
    Bound.REMOTE: _remote,
    Bound.DECODE: _decode,
    Bound.INPUT: _input,
    Bound.COMPUTE: _compute,
}


def message(bound: Bound, evidence: Evidence, actions: Sequence[Action]) -> str:
    """The one-line verdict: the bound, its evidence and what to change."""
    return _MESSAGES[bound](evidence, actions)


def note(observation: Observation) -> str:
    """One observation as a note."""
    if isinstance(observation, ArrivedLast):
        return (
            f"rank {observation.rank} waited for data {pct(observation.wait)} of the time against {pct(observation.others)} on the "
            "others, but its own read and decode are no slower (or unknown): it arrived last at the all-reduce, not a straggler"
        )
    if isinstance(observation, LoaderOnly):
        return (
            "loader-only run: with no compute every rank waits for data by construction; "
            "give --model NAME or --compute-ms T to see whether the loader keeps up with your training step"
        )
    if isinstance(observation, WarmCache):
        return (
            f"{pct(observation.resident)} of DATA was in the page cache, so the disk was barely read; rerun with --cold to measure the disk"
        )
    if isinstance(observation, DaliReadsUntimed):
        return (
            "the DALI loader's reads are not timed, so waiting for the store and decoding cannot "
            "be told apart; `--backend torch` measures both"
        )
    if isinstance(observation, BestRun):
        return f"best for {observation.backend}: {plural(observation.workers, 'worker')}, {observation.images_per_s:.0f} images/s"
    raise TypeError(f"not an observation: {observation!r}")
