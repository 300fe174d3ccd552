"""Start-up of a 2-rank CPU run: imgpipe's launcher on torch's elastic agent against another imgpipe tree's launcher.

Two measurements, each the wall time of a fresh process from its start to its exit, in alternating
rounds (this tree, the baseline tree, then the other way round):

- ``launch``: ``launch()`` of 2 gloo ranks that all-reduce one number and return: the launcher's own
  cost, the ranks' torch import included;
- ``train``: ``imgpipe train --gpus 0 --nproc 2`` of 2 steps on synthetic batches (resnet18 at 32 px, no
  validation): the start-up a user waits through before a run's first steps, plus those 2 steps.

Printed: each run, then the medians and the median of the per-round ratios (this tree / baseline).

Usage::

    git archive main | tar -x -C /tmp/imgpipe-main     # the baseline: another checkout (its C extensions built or copied)
    python benchmarks/launch_startup.py --baseline /tmp/imgpipe-main --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RANKS = """
import torch
import torch.distributed as dist
from imgpipe.train.launch import launch


def per_rank(ctx, _):
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


if __name__ == "__main__":
    assert launch(per_rank, None, gpus=0, nproc=2, timeout_s=60) == 2.0
"""


def environment(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}}
    env.update(PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds


def train_config(folder: Path, packed: Path, name: str) -> Path:
    config = {
        "data": {"path": str(packed), "backend": "synthetic", "image_size": 32, "workers": 0},
        "model": {"name": "resnet18"},
        "train": {"epochs": 1, "max_steps": 2, "batch_size": 8, "validate": False},
        "output": {"dir": str(folder / f"run-{name}"), "tensorboard": False, "checkpoint_every_epochs": 0, "overwrite": True},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another imgpipe tree (its root)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = {"this": ROOT, "baseline": args.baseline.resolve()}
    with tempfile.TemporaryDirectory(prefix="imgpipe-launch-") as tmp:
        work = Path(tmp)
        from imgpipe.packing.packer import pack
        from imgpipe.synth.tree import make_synthetic

        (work / "ranks.py").write_text(RANKS)
        make_synthetic(work / "src", classes=2, per_class=8, val_per_class=2, min_side=32, max_side=48, progress=False)
        pack(work / "src", work / "packed", shards=1, workers=1, progress=False)
        times: dict[tuple[str, str], list[float]] = {(kind, tree): [] for kind in ("launch", "train") for tree in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for tree in order:
                env = environment(trees[tree])
                times["launch", tree].append(timed([sys.executable, str(work / "ranks.py")], env, work))
                config = train_config(work, work / "packed", tree)
                command = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0", "--nproc", "2"]
                times["train", tree].append(timed(command, env, work))
            print(f"round {r}: " + ", ".join(f"{kind} {tree} {values[-1]:.1f} s" for (kind, tree), values in times.items()), flush=True)
        for kind in ("launch", "train"):
            this, base = times[kind, "this"], times[kind, "baseline"]
            ratios = [a / b for a, b in zip(this, base)]
            print(
                f"{kind}: median {statistics.median(this):.2f} s (this tree) vs {statistics.median(base):.2f} s (baseline); "
                f"median ratio per round {statistics.median(ratios):.2f}x"
            )


if __name__ == "__main__":
    main()
