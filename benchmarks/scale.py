"""The cost of every phase as the dataset grows: per-record time and peak RSS at 13 k, 128 k and 1.33 M files.

Writes (once per size, under ``--work``, a tmpfs by default) an ImageNet-shaped tree of tiny
JPEGs (24-40 px, a few hundred bytes: only the file count is large): ``train/<wnid>/*.JPEG`` in
1,000 classes and a flat ``val/`` with ``LOC_val_solution.csv``, in ImageNet's proportions
(1,281,167 + 50,000 at full size). Then runs each phase in a fresh interpreter, timed after its
imports, and records its wall and CPU seconds (its own and its reaped workers') and its peak RSS
(VmHWM of the process, and the largest of its workers'):

    scan, plan          the pack's scan, and its plan (``packer._plan`` less the scan)
    pack                ``imgpipe.pack`` with ``--workers``, shards of ``--shard-size`` (about 1,300 records)
    verify, info        ``imgpipe.verify`` (no decode), ``format.info.describe`` + ``format_info``
    open_shards         ``imgpipe.open_shards(DIR, "train")``
    loader              ``make_torch_loader`` (batch 256, 32 px, ``--workers``) built, and its first batch
    epoch               a steady epoch of that loader: batches 20 to the end of the first epoch
    resume              ``state_dict()`` after 5 batches, a new loader ``load_state_dict``, its first batch;
                        exact: the same records and pixels as the first loader's next batch
    eval                the val split, ``train=False``, as 2 ranks: every record exactly once
    stage               ``imgpipe.stage(DIR, DIR2)``: a checked local copy
    cache_fill          ``open_shards(URL, cache_dir=C)`` from the moto S3 server of the tests
                        (``benchmarks/_s3_server.py``, no added latency) until C holds the whole dataset

Per-record cost is CPU seconds per record (wall is shown too: on a shared machine CPU time is the
steadier figure); the growth ratio is the largest size's per-record cost over the one before it.
Goals (issue 31): every ratio <= 1.25, pack peak RSS <= 1 GB at 1.33 M, first batch <= 10 s,
resume exact, eval exactly once.

    python benchmarks/scale.py [--sizes 13000,128000,1331167] [--phases all] [--work DIR] [--keep]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FULL_TRAIN, FULL_VAL = 1_281_167, 50_000
CLASSES = 1000
POOL = 2048  # distinct tiny JPEGs, dealt out to the files
PHASES = ("scan", "plan", "pack", "verify", "info", "open_shards", "loader", "epoch", "resume", "eval", "stage", "cache_fill")
LOADER_PHASES = ("loader", "epoch", "resume", "eval")
BATCH, IMAGE_SIZE = 256, 32
GOAL_RATIO, GOAL_PACK_RSS_MB, GOAL_FIRST_BATCH_S = 1.25, 1000, 10.0


# ----------------------------------------------------------------------------- the tree


def tiny_jpegs(count: int, seed: int = 0) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        w, h = (int(v) for v in rng.integers(24, 41, size=2))
        base = rng.integers(0, 256, size=3)
        ramp = np.linspace(0, 1, w)[None, :, None] * rng.integers(0, 128, size=3) + np.linspace(0, 1, h)[:, None, None] * 64
        pixels = np.clip(base + ramp + rng.normal(0, 12, size=(h, w, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=85)
        out.append(buffer.getvalue())
    return out


def split_sizes(files: int) -> tuple[int, int]:
    val = round(files * FULL_VAL / (FULL_TRAIN + FULL_VAL))
    return files - val, val


def make_tree(root: Path, files: int) -> Path:
    """``root/train/<wnid>/<wnid>_<k>.JPEG`` and flat ``root/val/`` + ``LOC_val_solution.csv``; made once."""
    done = root / ".complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    train, val = split_sizes(files)
    pool = tiny_jpegs(POOL)
    wnids = [f"n{10_000_000 + 7919 * c:08d}" for c in range(CLASSES)]
    for c, wnid in enumerate(wnids):
        folder = root / "train" / wnid
        folder.mkdir(parents=True)
        for k in range(c, train, CLASSES):
            (folder / f"{wnid}_{k}.JPEG").write_bytes(pool[k % POOL])
    (root / "val").mkdir()
    rows = ["ImageId,PredictionString"]
    for k in range(val):
        name = f"ILSVRC2012_val_{k + 1:08d}"
        (root / "val" / f"{name}.JPEG").write_bytes(pool[(k * 7) % POOL])
        rows.append(f"{name},{wnids[k % CLASSES]} 1 1 20 20")
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    done.touch()
    return root


# ----------------------------------------------------------------------------- phases (each in a fresh child)


def hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def cpu_s() -> float:
    """CPU seconds of this process, its reaped children and its live ones (loader workers, the store helper)."""
    from _measure import cpu_seconds

    return cpu_seconds()


def worker_peak_mb(pids: list[int]) -> float:
    peak = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                peak = max(peak, next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")))
        except (OSError, StopIteration):
            continue
    return peak


def children() -> list[int]:
    from _measure import child_pids

    return child_pids()


def loader(dst: Path, workers: int, **kw: Any) -> Any:
    from imgpipe.loaders.torch import make_torch_loader

    args = dict(batch_size=BATCH, image_size=IMAGE_SIZE, workers=workers, device=None, normalize=False, rank=0, world_size=1)
    return make_torch_loader(dst, **{**args, **kw})


def phase_scan(a: argparse.Namespace) -> dict[str, Any]:
    from imgpipe.ingest.scan import scan

    t0, c0 = time.perf_counter(), cpu_s()
    tree = scan(a.src)
    return {"seconds": time.perf_counter() - t0, "cpu": cpu_s() - c0, "records": sum(len(s) for s in tree.splits.values())}


def phase_plan(a: argparse.Namespace) -> dict[str, Any]:
    from imgpipe.packing import packer

    scanning = [0.0, 0.0]
    real_scan = packer.scan

    def timed_scan(*args: Any, **kw: Any) -> Any:
        t0, c0 = time.perf_counter(), cpu_s()
        try:
            return real_scan(*args, **kw)
        finally:
            scanning[0], scanning[1] = time.perf_counter() - t0, cpu_s() - c0

    packer.scan = timed_scan
    t0, c0 = time.perf_counter(), cpu_s()
    plan, _ = packer._plan(a.src, None, packer.parse_size(a.shard_size), None, None, 95, True, 0, a.workers)
    seconds, cpu = time.perf_counter() - t0 - scanning[0], cpu_s() - c0 - scanning[1]
    return {"seconds": seconds, "cpu": cpu, "records": sum(len(s.paths) for s in plan.splits.values()), "shards": len(plan.shards)}


def phase_pack(a: argparse.Namespace) -> dict[str, Any]:
    import imgpipe

    peak = [0.0]

    def watch() -> None:  # the workers' peak RSS, while they live
        while not stop:
            peak[0] = max(peak[0], worker_peak_mb(children()))
            time.sleep(0.2)

    import threading

    stop = False
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0, c0 = time.perf_counter(), cpu_s()
    report = imgpipe.pack(a.src, a.dst, workers=a.workers, shard_size=a.shard_size, overwrite=True, progress=False)
    seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
    stop = True
    watcher.join()
    workers_peak = max(peak[0], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    return {"seconds": seconds, "cpu": cpu, "records": sum(report.records.values()), "workers_peak_mb": workers_peak}


def phase_verify(a: argparse.Namespace) -> dict[str, Any]:
    import imgpipe

    t0, c0 = time.perf_counter(), cpu_s()
    report = imgpipe.verify(a.dst, workers=a.workers, progress=False)
    assert report.ok, report.summary()
    return {"seconds": time.perf_counter() - t0, "cpu": cpu_s() - c0, "records": a.records}


def phase_info(a: argparse.Namespace) -> dict[str, Any]:
    from imgpipe.format.info import describe, format_info

    t0, c0 = time.perf_counter(), cpu_s()
    text = format_info(describe(a.dst))
    assert "train" in text
    return {"seconds": time.perf_counter() - t0, "cpu": cpu_s() - c0, "records": a.records}


def phase_open_shards(a: argparse.Namespace) -> dict[str, Any]:
    import imgpipe

    t0, c0 = time.perf_counter(), cpu_s()
    shards = imgpipe.open_shards(a.dst, "train")
    return {"seconds": time.perf_counter() - t0, "cpu": cpu_s() - c0, "records": len(shards)}


def phase_loader(a: argparse.Namespace) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), cpu_s()
    train = loader(a.dst, a.workers)
    built = time.perf_counter() - t0
    images, _ = next(iter(train))
    first = time.perf_counter() - t0
    assert images.shape == (BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)
    out = {"seconds": first, "cpu": cpu_s() - c0, "records": a.train, "built_s": built, "first_batch_s": first}
    out["workers_peak_mb"] = worker_peak_mb(children())
    train.close()
    return out


def phase_epoch(a: argparse.Namespace) -> dict[str, Any]:
    train = loader(a.dst, a.workers)
    images = 0
    t0 = c0 = 0.0
    for k, (batch, _) in enumerate(train):
        if k == 20:
            t0, c0, images = time.perf_counter(), cpu_s(), 0
        images += batch.shape[0]
    seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
    out = {"seconds": seconds, "cpu": cpu, "records": images, "workers_peak_mb": worker_peak_mb(children())}
    train.close()
    return out


def phase_resume(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    first = loader(a.dst, a.workers)
    batches = iter(first)
    for _ in range(5):
        next(batches)
    t0, c0 = time.perf_counter(), cpu_s()
    state = first.state_dict()
    took = time.perf_counter() - t0, cpu_s() - c0
    expected, _ = next(batches)
    expected, expected_records = expected.clone(), first.last_records.copy()
    first.close()
    t0, c0 = time.perf_counter(), cpu_s()
    second = loader(a.dst, a.workers)
    second.load_state_dict(state)
    images, _ = next(iter(second))
    seconds, cpu = took[0] + time.perf_counter() - t0, took[1] + cpu_s() - c0
    exact = bool(np.array_equal(second.last_records, expected_records) and torch.equal(images, expected))
    second.close()
    return {"seconds": seconds, "cpu": cpu, "records": a.train, "exact": exact}


def phase_eval(a: argparse.Namespace) -> dict[str, Any]:
    seen: list[np.ndarray] = []
    t0, c0 = time.perf_counter(), cpu_s()
    for rank in (0, 1):
        val = loader(a.dst, a.workers, split="val", train=False, rank=rank, world_size=2)
        for _ in val:
            seen.append(val.last_records.copy())
        val.close()
    seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
    records = np.concatenate(seen)
    once = bool(records.size == a.val and np.array_equal(np.sort(records), np.arange(a.val)))
    return {"seconds": seconds, "cpu": cpu, "records": int(records.size), "exactly_once": once}


def phase_stage(a: argparse.Namespace) -> dict[str, Any]:
    import imgpipe

    copy = a.work / "staged"
    shutil.rmtree(copy, ignore_errors=True)
    t0, c0 = time.perf_counter(), cpu_s()
    imgpipe.stage(a.dst, copy)
    seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
    shutil.rmtree(copy)
    return {"seconds": seconds, "cpu": cpu, "records": a.records}


def phase_cache_fill(a: argparse.Namespace) -> dict[str, Any]:
    import imgpipe

    cache = a.work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    t0, c0 = time.perf_counter(), cpu_s()
    imgpipe.open_shards(a.url, "train", cache_dir=cache)
    deadline = time.monotonic() + 3600
    while not (cache / "manifest.json").is_file():  # this process's store helper fills the cache meanwhile
        assert time.monotonic() < deadline, "the cache did not fill in an hour"
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    cpu = cpu_s() - c0
    peak = worker_peak_mb(children())
    shutil.rmtree(cache)
    return {"seconds": seconds, "cpu": cpu, "records": a.records, "workers_peak_mb": peak}


PHASE_FUNCTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {name: globals()[f"phase_{name}"] for name in PHASES}


def child(spec: dict[str, Any]) -> None:
    a = argparse.Namespace(**spec)
    if a.phase in LOADER_PHASES:
        import torch

        torch.set_num_threads(1)
    a.src, a.dst, a.work = Path(a.src), Path(a.dst), Path(a.work)
    result = PHASE_FUNCTIONS[a.phase](a)
    result["peak_mb"] = hwm_mb()
    print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- driver


def run_phase(phase: str, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", json.dumps({**spec, "phase": phase})]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{phase} at {spec['records']:,} files failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_record(r: dict[str, Any]) -> float:
    """CPU microseconds per record."""
    return 1e6 * r["cpu"] / max(r["records"], 1)


def table(results: dict[int, dict[str, dict[str, Any]]], phases: list[str]) -> list[str]:
    sizes = sorted(results)
    head = f"| phase | {' | '.join(f'{n:,} files: us/record CPU (wall), peak RSS MB' for n in sizes)} | growth, last two sizes |"
    lines = [head, "| --- |" + " --- |" * (len(sizes) + 1)]
    ratios: dict[str, float] = {}
    for phase in phases:
        cells, per = [], []
        for n in sizes:
            r = results[n].get(phase)
            if r is None:
                cells.append("-")
                per.append(None)
                continue
            us_cpu, us_wall = per_record(r), 1e6 * r["seconds"] / max(r["records"], 1)
            rss = f"{r['peak_mb']:.0f}" + (f" (workers {r['workers_peak_mb']:.0f})" if r.get("workers_peak_mb") else "")
            cells.append(f"{us_cpu:.2f} ({us_wall:.2f}), {rss}")
            per.append(us_cpu)
        known = [p for p in per if p is not None]
        ratio = known[-1] / known[-2] if len(known) >= 2 and known[-2] > 0 else float("nan")
        ratios[phase] = ratio
        lines.append(f"| {phase} | {' | '.join(cells)} | {ratio:.2f}x |")
    return lines


def goals(results: dict[int, dict[str, dict[str, Any]]]) -> list[str]:
    top = results[max(results)]
    out = []
    if "pack" in top:
        peak = max(top["pack"]["peak_mb"], top["pack"].get("workers_peak_mb", 0))
        out.append(
            f"pack peak RSS at {max(results):,} files: {peak:.0f} MB (goal <= {GOAL_PACK_RSS_MB} MB): {_met(peak <= GOAL_PACK_RSS_MB)}"
        )
    if "loader" in top:
        first = top["loader"]["first_batch_s"]
        ok = _met(first <= GOAL_FIRST_BATCH_S)
        out.append(f"first batch at {max(results):,} files: {first:.2f} s (goal <= {GOAL_FIRST_BATCH_S:.0f} s): {ok}")
    for n in sorted(results):
        if "resume" in results[n]:
            out.append(f"resume exact at {n:,} files: {_met(results[n]['resume']['exact'])}")
        if "eval" in results[n]:
            out.append(f"eval exactly once at {n:,} files: {_met(results[n]['eval']['exactly_once'])}")
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of a phase's runs (every check must hold in every run)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if key in r]
        out[key] = all(values) if isinstance(values[0], bool) else float(np.median(values))
    out["runs"] = len(runs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="13000,128000,1331167", help="files per dataset (train + val), comma-separated")
    p.add_argument("--phases", default="all", help=f"comma-separated, of: {', '.join(PHASES)}")
    p.add_argument("--rounds", type=int, default=1, help="rounds over the sizes (alternating their order); medians are shown")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shard-size", default="1MB", help="about 1,300 of these tiny records per shard, as ImageNet's 1,024 shards")
    p.add_argument("--work", type=Path, help="where the trees and packs go (default: a folder in /dev/shm, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the trees and packs in --work for the next run")
    p.add_argument("--json", type=Path, help="add the runs to this file (made if missing) and show the table of all its runs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests" / "remote"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if a.child:
        child(json.loads(a.child))
        return 0
    from _measure import compile_bytecode
    from s3_server import S3Server

    compile_bytecode()
    phases = list(PHASES) if a.phases == "all" else [s.strip() for s in a.phases.split(",")]
    unknown = set(phases) - set(PHASES)
    if unknown:
        p.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    sizes = [int(s) for s in a.sizes.split(",")]
    work = a.work or Path(tempfile.mkdtemp(prefix="imgpipe-scale.", dir="/dev/shm"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    if a.json and a.json.is_file():
        runs = {int(n): phases_runs for n, phases_runs in json.loads(a.json.read_text()).items()}
    try:
        with S3Server(lifetime_s=7200) as server:
            env.update(server.env())
            specs, urls = {}, {}
            for files in sizes:
                folder = work / str(files)
                t0 = time.perf_counter()
                src = make_tree(folder / "src", files)
                print(f"{files:,} files: tree ready in {time.perf_counter() - t0:.0f} s ({src})", flush=True)
                train, val = split_sizes(files)
                specs[files] = {"src": str(src), "dst": str(folder / "rec"), "work": str(folder), "records": files, "train": train,
                                "val": val, "workers": a.workers, "shard_size": a.shard_size, "url": ""}  # fmt: skip
            for round_ in range(a.rounds):
                for files in sizes if round_ % 2 == 0 else sizes[::-1]:
                    spec = specs[files]
                    for phase in phases:
                        if phase == "cache_fill" and files not in urls:
                            urls[files] = server.upload(spec["dst"], "imgpipe-scale", str(files))
                        spec["url"] = urls.get(files, "")
                        r = run_phase(phase, spec, env)
                        runs.setdefault(files, {}).setdefault(phase, []).append(r)
                        extra = f", workers {r['workers_peak_mb']:.0f} MB" if r.get("workers_peak_mb") else ""
                        print(f"  round {round_ + 1}, {files:,} files: {phase:12s} {r['seconds']:8.2f} s, {r['cpu']:8.2f} CPU s, "
                              f"{per_record(r):7.2f} us/record, peak {r['peak_mb']:6.0f} MB{extra}", flush=True)  # fmt: skip
                    if a.json:
                        a.json.write_text(json.dumps({str(k): v for k, v in sorted(runs.items())}, indent=1))
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    results = {n: {phase: summary(r) for phase, r in by_phase.items()} for n, by_phase in runs.items()}
    shown = [phase for phase in PHASES if any(phase in by_phase for by_phase in results.values())]
    print("\n" + "\n".join(table(results, shown)))
    print("\n" + "\n".join(goals(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
