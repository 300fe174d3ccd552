"""Helpers for the bench tests: hand-made measurements and recorded /proc samples."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest

from imgpipe._sys.diskinfo import DiskInfo
from imgpipe.bench.config import BenchConfig
from imgpipe.bench.runner import BenchResult, RunResult
from imgpipe.bench.stats import RankStats, StepTimes
from imgpipe.bench.system import Sample, SystemSummary, take_sample

DATA = Path(__file__).parent / "data"


def recorded(folder: Path, t: float, monkeypatch: pytest.MonkeyPatch) -> Sample:
    """The sample psutil takes of a recorded /proc (``folder``), stamped ``t``; its meminfo lacks fields psutil warns about."""
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return take_sample(t=t)


def rank_stats(
    rank: int,
    *,
    wait: float,
    read: float = 0.001,
    decode: float = 0.004,
    compute: float = 0.02,
    sync: float = 0.0,
    steps: int = 10,
    batch: int = 8,
    timed: bool = True,
    requests: int = 0,
    request_s: float = 0.0,
    fetched: int = 0,
) -> RankStats:
    """A rank whose every step has the given phase times (seconds) and, from a URL, store requests
    (``requests`` in as many calls, ``request_s`` seconds summed, ``fetched`` bytes)."""
    stats = RankStats(rank, batch, timed_phases=timed)
    start = 0.0
    for _ in range(steps):
        stats.steps.append(StepTimes(start, wait, read, decode, 0.0, 0.0, compute, sync, requests, requests, request_s, fetched))
        start += wait + compute + sync
    return stats


def system(iowait: float = 1.0, cpu: float = 50.0) -> SystemSummary:
    return SystemSummary(
        seconds=2.0,
        samples=9,
        cpu_util_pct=cpu,
        iowait_pct=iowait,
        iowait_max_pct=iowait,
        read_mb_s=5.0,
        mem_available_mb=1000.0,
        cached_mb=500.0,
    )


SSD = DiskInfo("/dev/nvme0n1p2", "/", "ext4", False, False)
HDD = DiskInfo("/dev/sdb1", "/data", "ext4", True, False)


def result(
    runs: list[RunResult], *, disk: DiskInfo = SSD, cold: bool = False, cpus: int = 8, region_decoder: bool = True, **config: object
) -> BenchResult:
    """A BenchResult around hand-made runs."""
    ranks = len(runs[0].ranks)
    config.setdefault("compute_ms", 20.0)
    data = str(config.pop("data", "/data/imagenet"))
    cfg = BenchConfig(data=data, nproc=ranks, cold=cold, workers=tuple(sorted({r.workers for r in runs})), **config)
    return BenchResult(cfg, disk, records=1000, data_bytes=10**8, cpus=cpus, device="cpu", runs=runs, region_decoder=region_decoder)


def run(
    ranks: list[RankStats], *, workers: int = 2, iowait: float = 1.0, resident: float | None = 0.0, backend: str = "torch"
) -> RunResult:
    return RunResult(backend, workers, ranks, 0.0, 2.0, resident, system(iowait))


# ----------------------------------------------------------------------------- JSON schema (docs/bench-json.md)

NUM = (int, float)
OPT_NUM = (int, float, type(None))
PHASES = {k: OPT_NUM for k in ("read", "decode", "collate", "h2d", "compute", "sync")}
RANK = {
    "rank": int,
    "images_per_s": NUM,
    "own_images_per_s": NUM,
    "data_wait_frac": NUM,
    "batch_ms_p50": NUM,
    "batch_ms_p95": NUM,
    "steps": int,
    "images": int,
    "stages_ms": PHASES,
    "timeline": list,
}
SYSTEM = {
    "seconds": NUM,
    "samples": int,
    "cpu_util_pct": NUM,
    "iowait_pct": NUM,
    "iowait_max_pct": NUM,
    "read_mb_s": OPT_NUM,
    "mem_available_mb": NUM,
    "cached_mb": NUM,
}
STORE_IO = {"requests": int, "calls": int, "latency_ms": NUM, "requests_per_s": NUM, "mb_per_s": NUM, "bytes": int, "seconds": NUM}
RUN = {
    "backend": str,
    "workers": int,
    "images_per_s": NUM,
    "imbalance": NUM,
    "page_cache_resident_before": OPT_NUM,
    "system": (SYSTEM, type(None)),
    "store_io": (STORE_IO, type(None)),
    "ranks": [RANK],
}
# docs/bench-json.md, schema_version 1: a key that disappears or changes type fails here
SCHEMA: dict[str, Any] = {
    "schema_version": int,
    "imgpipe_version": str,
    "data": {
        "path": str,
        "split": str,
        "records": int,
        "bytes": int,
        "disk": {"device": str, "mountpoint": str, "fstype": str, "rotational": (bool, type(None)), "network": bool},
    },
    "config": {
        "ranks": int,
        "gpus": int,
        "device": str,
        "cpus": int,
        "region_decoder": bool,
        "backends": [str],
        "workers": [int],
        "steps": int,
        "warmup": int,
        "batch_size": int,
        "image_size": int,
        "model": (str, type(None)),
        "compute_ms": NUM,
        "cold": bool,
    },
    "runs": [RUN],
    "best": {"*": {"workers": int, "images_per_s": NUM}},
    "verdict": {
        "bound": str,
        "message": str,
        "backend": str,
        "workers": int,
        "straggler": (int, type(None)),
        "cause": (str, type(None)),
        "notes": [str],
        "evidence": dict,  # its keys depend on the bound (docs/bench-json.md)
        "actions": [dict],
    },
}


def check(value: Any, spec: Any, where: str = "$") -> None:
    """Assert ``value`` matches ``spec``: a dict of keys, a one-item list, a type or a tuple of alternatives."""
    if isinstance(spec, tuple) and any(isinstance(s, dict) for s in spec):
        if value is None and type(None) in spec:
            return
        spec = next(s for s in spec if isinstance(s, dict))
    if isinstance(spec, dict):
        assert isinstance(value, dict), f"{where} is not an object"
        if set(spec) == {"*"}:
            for key, item in value.items():
                check(item, spec["*"], f"{where}.{key}")
            return
        assert set(value) == set(spec), f"{where}: keys {sorted(set(value) ^ set(spec))} differ from the schema"
        for key, sub in spec.items():
            check(value[key], sub, f"{where}.{key}")
    elif isinstance(spec, list):
        assert isinstance(value, list), f"{where} is not a list"
        for i, item in enumerate(value):
            check(item, spec[0], f"{where}[{i}]")
    else:
        assert isinstance(value, spec) and not (spec in (int, NUM) and isinstance(value, bool)), f"{where}={value!r} is not {spec}"
