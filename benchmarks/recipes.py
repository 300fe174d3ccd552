"""Time to accuracy on the CPU: progressive resizing plus a larger validation size against one fixed size.

The claim (issue 21): ResNet-18 trained with a resolution ramp (most epochs below the final size,
FFCV's recipe shape) and validated above its training size (FixRes) reaches the fixed-size run's
validation top-1 within 2 points, in at most 0.8x its wall time.

Data: ImageNet-layout synthetic classes (``imgpipe synth``: a hue pair and a stripe pattern per
class, with per-image jitter, noise and blobs), packed with ``--resize`` to a short side a little
above the validation size, as one packs ImageNet for low-resolution training (FFCV packs at 400-500
px for 160-192 px training). 50 classes make the hues of neighbouring classes close, so the task is
not solved at once; 500 validation images make one image 0.2 points of top-1. Both runs are the real
``imgpipe train`` CLI, one process each, alternating fixed, progressive, fixed, ...; round r runs both
with seed r (one seed's top-1 moves by several points on a set this small, so the medians over seeds are
compared); the wall time is the trainer's own (``wall_s`` of the last epoch: training plus every
epoch's validation, no process start-up), and the top-1 the last epoch's. The CPU seconds of each
whole run (its loader workers too) are printed beside: on a machine shared with other work they move
less than the wall time. Printed: each run, then the medians and the median of the per-round ratios
(a machine shared with other work disturbs a ratio taken within one round less).

Usage::

    python benchmarks/recipes.py                 # 50 classes x 32 train / 10 val, 96 px, 8 epochs, 2 rounds, 1 thread
                                                 # (~40 min on 2 idle cores)
    python benchmarks/recipes.py --rounds 4      # medians over 4 seeds

The sizes: fixed at 96 px; progressive at 64 px, then 96 px for the last two epochs, validated at
112 px (FFCV's ResNet-50 goes from 160 to 192 px, validated at 256). On the CPU the loader shares
the cores with the model, so the images must be large enough for the model to dominate a step, as
it does on a GPU: at 64 px (start 40 or 48) the decode, validation and start-up that do not shrink
with the size held the progressive run at 0.88-0.89x the fixed run's wall time on the idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _measure import compile_bytecode  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]


def make_data(work: Path, classes: int, per_class: int, val_per_class: int, resize: int) -> Path:
    """The packed set (made once per --work folder)."""
    packed = work / f"packed-{classes}x{per_class}-r{resize}"
    if (packed / "manifest.json").exists():
        return packed
    from imgpipe.packing.packer import pack
    from imgpipe.synth.tree import make_synthetic

    src = work / f"src-{classes}x{per_class}"
    if not (src / "train").exists():
        make_synthetic(
            src, classes=classes, per_class=per_class, val_per_class=val_per_class, min_side=200, max_side=400, workers=2, progress=False
        )
    pack(src, packed, shards=4, workers=2, resize=resize, progress=False)
    return packed


def config(args: argparse.Namespace, packed: Path, out: Path, progressive: bool, seed: int) -> Path:
    """The run's YAML: the same model, optimizer, schedule and data for both; sizes differ."""
    data: dict = {"path": str(packed), "workers": args.workers, "image_size": args.size}
    if progressive:
        # FFCV's shape: the low size for most epochs, the ramp to the final size late (its rounding to 32 px
        # makes 48 -> 64 one step), validation above the final training size
        data.update(
            image_size=args.start,
            resolution={"start_px": args.start, "end_px": args.size, "start_ramp": args.epochs - 3, "end_ramp": args.epochs - 2},
            val_image_size=args.val_size,
        )
    text = {
        "data": data,
        "model": {"name": "resnet18"},
        "optim": {
            "base_lr": args.base_lr,
            "schedule": "linear_ramp",
            "lr_peak_epoch": 2,
            "warmup_epochs": 0,
            "label_smoothing": 0.1,
            "nesterov": False,
        },
        "train": {"epochs": args.epochs, "batch_size": args.batch, "seed": seed, "log_every": 1000, "timeout_s": 600, "compile": False},
        "output": {"dir": str(out), "tensorboard": False, "checkpoint_every_epochs": 0},
    }
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(text, sort_keys=False))
    return path


def run(args: argparse.Namespace, packed: Path, out: Path, progressive: bool, seed: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: metrics.jsonl appends
    path = config(args, packed, out, progressive, seed)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT))
    start, cpu = time.perf_counter(), children_cpu_s()
    done = subprocess.run(
        [sys.executable, "-m", "imgpipe", "train", "--config", str(path), "--gpus", "0"], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"recipes: the {'progressive' if progressive else 'fixed'} run failed:\n{done.stderr[-3000:]}")
    epochs = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]
    last = epochs[-1]
    return {
        "top1": last["val_top1"],
        "wall_s": last["wall_s"],
        "process_s": time.perf_counter() - start,
        "cpu_s": children_cpu_s() - cpu,
        "sizes": [e["resolution"] for e in epochs],
        "val_px": last["val_resolution"],
        "top1_by_epoch": [round(e["val_top1"], 3) for e in epochs],
    }


def children_cpu_s() -> float:
    """CPU seconds of the finished child processes (a run, its loader workers included: each reaps its own)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def describe(name: str, result: dict) -> str:
    return (
        f"{name:<12} top-1 {result['top1']:.4f}  wall {result['wall_s']:7.1f} s "
        f"(process {result['process_s']:.1f} s, CPU {result['cpu_s']:.1f} s)  "
        f"train px {result['sizes']}  val px {result['val_px']}  top-1 by epoch {result['top1_by_epoch']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--per-class", type=int, default=32)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--size", type=int, default=96, help="the fixed run's size; the progressive run's final one")
    parser.add_argument("--start", type=int, default=64, help="the progressive run's size before the ramp")
    parser.add_argument("--val-size", type=int, default=112, help="the progressive run's validation size")
    parser.add_argument("--resize", type=int, default=128, help="pack --resize: the stored short side")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--base-lr", type=float, default=0.4)
    parser.add_argument("--workers", type=int, default=1, help="loader workers per run")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of each run (1: the model's step scales with the image as on a GPU, "
        "and the loader worker has the other core)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs, round r with seed r (the top-1 of one seed moves by points)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-recipes-bench")
    args = parser.parse_args()
    compile_bytecode()
    args.work.mkdir(parents=True, exist_ok=True)
    packed = make_data(args.work, args.classes, args.per_class, args.val_per_class, args.resize)
    print(
        f"recipes: resnet18, {args.classes} classes x {args.per_class} train / {args.val_per_class} val "
        f"(packed at short side {args.resize}), "
        f"{args.epochs} epochs, batch {args.batch}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    fixed, progressive, ratios, cpu_ratios = [], [], [], []
    for round_ in range(args.rounds):
        a = run(args, packed, args.work / f"fixed-{round_}", progressive=False, seed=round_)
        print(describe(f"fixed s{round_}", a), flush=True)
        b = run(args, packed, args.work / f"progressive-{round_}", progressive=True, seed=round_)
        print(describe(f"progr. s{round_}", b), flush=True)
        fixed.append(a)
        progressive.append(b)
        ratios.append(b["wall_s"] / a["wall_s"])
        cpu_ratios.append(b["cpu_s"] / a["cpu_s"])
    top1_fixed = statistics.median(r["top1"] for r in fixed)
    top1_prog = statistics.median(r["top1"] for r in progressive)
    ratio = statistics.median(ratios)
    wall_fixed = statistics.median(r["wall_s"] for r in fixed)
    wall_prog = statistics.median(r["wall_s"] for r in progressive)
    print(f"fixed {args.size} px, seeds 0-{args.rounds - 1}: median top-1 {top1_fixed:.4f}, median wall {wall_fixed:.1f} s")
    print(f"progressive {args.start}->{args.size} px, val {args.val_size} px: median top-1 {top1_prog:.4f}, median wall {wall_prog:.1f} s")
    gap = 100 * (top1_fixed - top1_prog)
    outcome = "met" if gap <= 2.0 and ratio <= 0.8 else "NOT met"
    print(
        f"progressive vs fixed: {-gap:+.1f} points of top-1, {ratio:.2f}x the wall time (median of {args.rounds} round ratio(s)), "
        f"{statistics.median(cpu_ratios):.2f}x the CPU time (whole processes: less disturbed by other work on the machine); "
        f"goal (within 2 points, <= 0.8x the wall time): {outcome}; load average now {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
