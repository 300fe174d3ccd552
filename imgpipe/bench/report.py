"""Bench results for people and programs: the terminal table, the JSON file, the PNG plot.

The JSON schema (``schema_version`` 1) is documented in docs/bench-json.md; a key is only
ever added in a minor change, and removing or retyping one bumps ``schema_version``.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

from imgpipe import __version__
from imgpipe._sys.atomic import atomic_write, atomic_write_bytes
from imgpipe.bench.runner import BenchResult, RunResult
from imgpipe.bench.stats import PHASES, RankStats
from imgpipe.bench.system import describe_disk
from imgpipe.bench.verdict import Verdict
from imgpipe.bench.wording import plural
from imgpipe.errors import ConfigError

SCHEMA_VERSION = 1
PLOT_HINT = "pip install 'imgpipe[plot]'"


# ----------------------------------------------------------------------------- output paths


def check_output_path(option: str, path: str | os.PathLike) -> None:
    """A ConfigError now, before minutes of measuring, unless ``path`` can be written as a file.

    The folder must exist and be writable, and ``path`` must not be a folder itself; the file
    is only written at the end of the run.
    """
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; give a file name inside it")
    if not folder.exists():
        raise ConfigError(f"{option} {path}: folder {folder} does not exist; create it (mkdir -p {folder}) or write elsewhere")
    if not folder.is_dir():
        raise ConfigError(f"{option} {path}: {folder} is a file, not a folder; choose a path in a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: folder {folder} is not writable; choose a path in a folder you can write to")


def require_matplotlib() -> None:
    """A ConfigError naming the extra to install unless matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(f"--plot needs matplotlib: {PLOT_HINT}") from None


# ----------------------------------------------------------------------------- JSON


def to_dict(result: BenchResult, verdict: Verdict) -> dict[str, Any]:
    """The documented JSON document (schema_version 1) of a bench."""
    config = result.config
    return {
        "schema_version": SCHEMA_VERSION,
        "imgpipe_version": __version__,
        "data": {
            "path": str(config.data),
            "split": config.split,
            "records": result.records,
            "bytes": result.data_bytes,
            "disk": {
                "device": result.disk.device,
                "mountpoint": result.disk.mountpoint,
                "fstype": result.disk.fstype,
                "rotational": result.disk.rotational,
                "network": result.disk.network,
            },
        },
        "config": {
            "ranks": config.ranks,
            "gpus": config.gpus,
            "device": result.device,
            "cpus": result.cpus,
            "region_decoder": result.region_decoder,
            "backends": list(config.backends),
            "workers": list(config.workers),
            "steps": config.steps,
            "warmup": config.warmup,
            "batch_size": config.batch_size,
            "image_size": config.train_size,
            "model": config.model,
            "compute_ms": float(config.compute_ms),
            "cold": config.cold,
        },
        "runs": [_run_dict(run) for run in result.runs],
        "best": {
            backend: {"workers": best.workers, "images_per_s": best.images_per_s}
            for backend in config.backends
            if (best := result.best(backend)) is not None
        },
        "verdict": verdict.to_dict(),
    }


def _run_dict(run: RunResult) -> dict[str, Any]:
    return {
        "backend": run.backend,
        "workers": run.workers,
        "images_per_s": run.images_per_s,
        "imbalance": run.imbalance,
        "page_cache_resident_before": run.resident_before,
        "system": run.system.to_dict() if run.system else None,
        "store_io": run.store_io.to_dict() if run.store_io else None,
        "ranks": [_rank_dict(rank) for rank in run.ranks],
    }


def _rank_dict(rank: RankStats) -> dict[str, Any]:
    summary = rank.summary()
    return {
        "rank": rank.rank,
        "images_per_s": summary.images_per_s,
        "own_images_per_s": rank.own_images_per_s,
        "data_wait_frac": summary.data_wait_frac,
        "batch_ms_p50": 1000 * summary.step_p50_s,
        "batch_ms_p95": 1000 * summary.step_p95_s,
        "steps": summary.steps,
        "images": summary.images,
        "stages_ms": rank.phase_ms(),  # the key bench.json (schema 1) was published with
        "timeline": [[s.start, s.wait, s.collate + s.h2d + s.compute, s.sync] for s in rank.steps],
    }


def write_json(path: str | os.PathLike, document: dict[str, Any]) -> Path:
    """Write the JSON document atomically."""
    path = Path(path)
    atomic_write_bytes(path, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    return path


# ----------------------------------------------------------------------------- table


def format_report(result: BenchResult, verdict: Verdict) -> str:
    """The terminal report: runs, the judged run's ranks and phases, the verdict and notes."""
    config = result.config
    lines = [
        f"imgpipe bench: {config.data} ({config.split}, {result.records} records, {result.data_bytes / 1e6:.1f} MB) "
        f"on {describe_disk(result.disk)}",
        f"{config.ranks} rank(s) on {result.device}, batch {config.batch_size}, {config.train_size} px, "
        + (f"model {config.model}" if config.model else f"compute {config.compute_ms:g} ms")
        + (", cold cache" if config.cold else ""),
        "",
        f"{'backend':<8} {'workers':>7} {'images/s':>9} {'balance':>7} {'cpu %':>6} {'iowait %':>8} {'read MB/s':>9} {'cached %':>8}",
    ]
    for run in result.runs:
        system = run.system
        lines.append(
            f"{run.backend:<8} {run.workers:>7} {run.images_per_s:>9.1f} {run.imbalance:>7.2f} "
            f"{_num(system.cpu_util_pct if system else None, 6)} {_num(system.iowait_pct if system else None, 8)} "
            f"{_num(system.read_mb_s if system else None, 9)} "
            f"{_num(100 * run.resident_before if run.resident_before is not None else None, 8, 0)}"
        )
    judged = next(r for r in result.runs if r.backend == verdict.backend and r.workers == verdict.workers)
    lines += [
        "",
        f"ranks of {judged.backend} with {plural(judged.workers, 'worker')} (phase times: ms per batch; read and decode are worker time)",
    ]
    lines.append(f"{'rank':>4} {'images/s':>9} {'wait %':>6} {'p50 ms':>7} {'p95 ms':>7} " + " ".join(f"{s:>7}" for s in PHASES))
    for rank in judged.ranks:
        summary = rank.summary()
        phases = rank.phase_ms()
        lines.append(
            f"{rank.rank:>4} {summary.images_per_s:>9.1f} {100 * summary.data_wait_frac:>6.1f} "
            f"{1000 * summary.step_p50_s:>7.1f} {1000 * summary.step_p95_s:>7.1f} " + " ".join(_num(phases[p], 7) for p in PHASES)
        )
    io = judged.store_io
    if io is not None:
        lines += ["", f"remote store: {io.requests:,} requests in {io.seconds:.1f} s ({io.requests_per_s:.0f}/s), "
                      f"{io.latency_ms:.0f} ms each on average, {io.fetched_bytes / 1e6:.1f} MB ({io.mb_per_s:.1f} MB/s)"]  # fmt: skip
    lines += ["", f"verdict: {verdict.message}"] + [f"note: {note}" for note in verdict.notes]
    return "\n".join(lines)


def _num(value: float | None, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


# ----------------------------------------------------------------------------- plot


def write_plot(path: str | os.PathLike, result: BenchResult, verdict: Verdict) -> Path:
    """PNG: per-rank timelines (data-wait / compute / sync) of the judged run, and images/s per run."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    judged = next(r for r in result.runs if r.backend == verdict.backend and r.workers == verdict.workers)
    fig, (timeline, bars) = plt.subplots(
        2, 1, figsize=(10, 3 + 0.5 * len(judged.ranks) + 3), gridspec_kw={"height_ratios": [max(2, len(judged.ranks)), 3]}
    )
    colors = {"data-wait": "tab:red", "compute": "tab:blue", "sync (other ranks)": "tab:gray"}
    for row, rank in enumerate(judged.ranks):
        for label, spans in (
            ("data-wait", [(s.start, s.wait) for s in rank.steps]),
            ("compute", [(s.start + s.wait, s.collate + s.h2d + s.compute) for s in rank.steps]),
            ("sync (other ranks)", [(s.start + s.total - s.sync, s.sync) for s in rank.steps]),
        ):
            timeline.broken_barh(spans, (row - 0.4, 0.8), color=colors[label], label=label if row == 0 else None)
    timeline.set_yticks(range(len(judged.ranks)), [f"rank {r.rank}" for r in judged.ranks])
    timeline.set_xlabel("seconds since the run started")
    timeline.set_title(f"{judged.backend}, {plural(judged.workers, 'worker')}: where each rank's time goes")
    timeline.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize="small", frameon=False)
    labels = [f"{r.backend}\n{plural(r.workers, 'worker')}" for r in result.runs]
    bars.bar(
        range(len(result.runs)),
        [r.images_per_s for r in result.runs],
        color=["tab:green" if r is judged else "tab:olive" for r in result.runs],
    )
    bars.set_xticks(range(len(result.runs)), labels)
    bars.set_ylabel("images/s (all ranks)")
    bars.set_title("throughput per backend and worker count")
    fig.suptitle("\n".join(textwrap.wrap(verdict.message, 130)[:4]), fontsize="small")
    fig.tight_layout()
    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)
