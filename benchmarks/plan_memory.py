"""Memory and time of scanning and planning an ImageNet-sized tree (1.28 M files), as `imgpipe pack` does.

Builds (once) a tree of tiny files in ImageNet's shape: `train/<wnid>/*.JPEG`, 1,000 classes.
Then, in a fresh interpreter for each run, times the pack's own scan + plan step
(`imgpipe.packing.packer._plan`, which stats every file for the shard-size estimate) and reports its
peak RSS. The baseline in the same run: a plain `os.walk` listing of the same tree, and
torchvision's `ImageFolder` indexing (which builds a list of (path, class) tuples).
Goal (issue 2): well under 1 GB for 1.28 M files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBES = {
    "imgpipe scan + plan": """
from imgpipe.packing.packer import _plan
plan = _plan(root, None, 256_000_000, None, None, 95, True, 0)
n = sum(len(s.paths) for s in plan.splits.values())
""",
    "os.walk listing": """
n = sum(len(files) for _, _, files in os.walk(root))
""",
    "torchvision ImageFolder": """
from torchvision.datasets import ImageFolder
n = len(ImageFolder(str(root / "train")).samples)
""",
}

RUNNER = """
import json, os, resource, sys, time
from pathlib import Path
root = Path(sys.argv[1])
start = time.perf_counter()
{probe}
elapsed = time.perf_counter() - start
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"files": n, "seconds": elapsed, "peak_rss_mb": peak_mb}}))
"""


def build_tree(root: Path, files: int, classes: int) -> None:
    """Tiny files in ImageNet's train layout; reused when already complete."""
    marker = root / f".complete-{files}-{classes}"
    if marker.exists():
        return
    train = root / "train"
    per_class, extra = divmod(files, classes)
    payload = b"\xff\xd8\xff\xd9"  # 4 bytes: the stat is what planning costs, not the content
    for c in range(classes):
        folder = train / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class + (1 if c < extra else 0)):
            (folder / f"n{c:08d}_{k}.JPEG").write_bytes(payload)
    marker.touch()


def measure(root: Path, probe: str) -> dict[str, float]:
    code = RUNNER.format(probe=probe)
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1_281_167)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to build (and reuse) the tree")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.gettempdir()) / "imgpipe-plan-memory"
    start = time.perf_counter()
    build_tree(root, args.files, args.classes)
    print(f"tree: {args.files:,} files in {args.classes} classes at {root} (ready in {time.perf_counter() - start:.0f} s)")
    print(f"{args.runs} runs each, fresh interpreter, warm page cache; medians\n")
    print(f"{'case':26s} {'files':>10s} {'seconds':>8s} {'peak RSS MB':>12s}")
    results = {}
    for name, probe in PROBES.items():
        runs = [measure(root, probe) for _ in range(args.runs)]
        seconds = statistics.median(r["seconds"] for r in runs)
        peak = statistics.median(r["peak_rss_mb"] for r in runs)
        results[name] = (seconds, peak)
        print(f"{name:26s} {int(runs[0]['files']):>10,d} {seconds:>8.2f} {peak:>12.1f}")
    seconds, peak = results["imgpipe scan + plan"]
    tv_seconds, tv_peak = results["torchvision ImageFolder"]
    outcome = "met" if peak < 1024 else "MISSED"
    print(f"\ngoal (scan + plan of {args.files:,} files well under 1 GB): {peak:.0f} MB peak RSS: {outcome}")
    print(f"imgpipe vs torchvision ImageFolder indexing: {tv_seconds / seconds:.2f}x the speed, {tv_peak / peak:.2f}x less peak RSS")


if __name__ == "__main__":
    main()
