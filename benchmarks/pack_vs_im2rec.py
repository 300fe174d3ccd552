"""imgpipe pack vs MXNet's tools/im2rec.py (and `cp -r`), as whole commands, at equal worker counts.

Modes:
  (a) keep bytes: ``imgpipe pack`` (default) vs ``im2rec.py --pass-through`` (and ``cp -r``);
  (b) re-encode:  ``imgpipe pack --resize 256 --quality 95`` vs ``im2rec.py --resize 256 --quality 95``;
  (t) tarballs:   ``imgpipe pack`` of the tree packed as ``ILSVRC2012_img_train.tar`` vs of the tree itself.

im2rec is timed as its two real steps, ``--list --recursive`` then the packing run;
imgpipe as one ``imgpipe pack`` (it lists by itself). Every command runs in a fresh
process, so start-up (imports) is part of the time. The source tree is read once before
timing so every run starts with a warm page cache; ``cp -r`` is timed with and without a
final ``sync`` (imgpipe fsyncs every shard, im2rec does not). imgpipe gets
``--shards 4*workers`` so that every worker has shards to write (im2rec parallelises
inside its single .rec). Medians over ``--repeats`` runs.

Usage::

    python benchmarks/pack_vs_im2rec.py                       # synthetic 20 classes x 50 (~100 MB)
    python benchmarks/pack_vs_im2rec.py --replicate 11 --modes a --cp   # a >= 1 GB tree, vs cp -r
    python benchmarks/pack_vs_im2rec.py --modes t             # from the tars vs from the extracted tree
    IMGPIPE_MXNET_PYTHON=/path/to/mxnet/venv/bin/python python benchmarks/pack_vs_im2rec.py --src SRC
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from imgpipe.synth import make_synthetic


def run_timed(commands: list[list[str]], cwd: Path | None = None) -> float:
    """Seconds to run ``commands`` one after the other; any failure stops the benchmark."""
    started = time.perf_counter()
    for command in commands:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"benchmark command failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-2000:]}")
    return time.perf_counter() - started


def tree_stats(train: Path) -> tuple[int, int]:
    """(image count, bytes) of a class-folder tree; reading every file also warms the page cache."""
    count = size = 0
    for path in train.rglob("*"):
        if path.is_file():
            count += 1
            size += len(path.read_bytes())
    return count, size


def replicate(src_train: Path, out: Path, copies: int) -> Path:
    """A bigger tree: ``copies`` copies of every image (distinct files) in the same class folders."""
    train = out / "train"
    if train.exists():
        return out
    for folder in sorted(p for p in src_train.iterdir() if p.is_dir()):
        (train / folder.name).mkdir(parents=True)
        for image in sorted(folder.iterdir()):
            for k in range(copies):
                shutil.copyfile(image, train / folder.name / f"{image.stem}_r{k}{image.suffix}")
    return out


def im2rec_path(mxnet_python: str) -> str:
    code = "import os, mxnet; print(os.path.join(os.path.dirname(mxnet.__file__), 'tools', 'im2rec.py'))"
    return subprocess.run([mxnet_python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def imgpipe_commands(src: Path, dst: Path, workers: int, resize: bool) -> list[list[str]]:
    command = [sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), "--splits", "train", "--workers", str(workers),
               "--shards", str(4 * workers), "--no-progress"]  # fmt: skip
    if resize:
        command += ["--resize", "256", "--quality", "95"]
    return [command]


def im2rec_commands(mxnet_python: str, im2rec: str, src: Path, prefix: Path, workers: int, resize: bool) -> list[list[str]]:
    root = str(src / "train")
    listing = [mxnet_python, im2rec, "--list", "--recursive", str(prefix), root]
    packing = [mxnet_python, im2rec, "--num-thread", str(workers), str(prefix), root]
    packing[2:2] = ["--resize", "256", "--quality", "95"] if resize else ["--pass-through"]
    return [listing, packing]


def records_in(folder: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in folder.glob("*.idx"))


def time_tars(src: Path, work: Path, workers: int, repeats: int, images: int) -> None:
    """Mode t: keep-bytes pack from the train tar (read in place) vs from the extracted tree, runs interleaved."""
    from imgpipe.synthtars import write_imagenet_tars

    tars = work / f"{src.name}-tars"
    if not (tars / "ILSVRC2012_img_train.tar").is_file():
        tars.mkdir(parents=True, exist_ok=True)
        write_imagenet_tars(src, tars, sorted(p.name for p in (src / "train").iterdir() if p.is_dir()), seed=0)
    (tars / "ILSVRC2012_img_train.tar").read_bytes()  # warm the page cache, as tree_stats did for the tree
    out = work / "out-tars"
    times: dict[str, list[float]] = {"tree": [], "tars": []}
    for _ in range(repeats):
        for name, source in (("tree", src), ("tars", tars)):
            shutil.rmtree(out, ignore_errors=True)
            times[name].append(run_timed(imgpipe_commands(source, out, workers, resize=False)))
            assert records_in(out) == images, f"pack from the {name} packed an unexpected number of records"
    shutil.rmtree(out, ignore_errors=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print("\n(t) keep bytes, from ILSVRC2012_img_train.tar vs from the extracted tree")
    for name, seconds in medians.items():
        print(f"  {name:<13} {seconds:7.2f} s  {images / seconds:9,.0f} images/s   runs: {', '.join(f'{t:.2f}' for t in times[name])}")
    print(f"  tars / tree: {medians['tree'] / medians['tars']:.2f}x the speed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, help="tree with train/<class>/* (default: a synthetic one, made once)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench", help="scratch folder")
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--replicate", type=int, default=1, help="copies of each image (e.g. 11 gives ~1 GB from the default)")
    parser.add_argument("--workers", type=int, default=min(4, len(os.sched_getaffinity(0))))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="a,b", help="a (keep bytes), b (resize 256, quality 95), t (from the tars), e.g. a,b,t")
    parser.add_argument("--cp", action="store_true", help="also time cp -r of the train tree (mode a)")
    parser.add_argument("--mxnet-python", default=os.environ.get("IMGPIPE_MXNET_PYTHON"), help="python of the MXNet venv")
    args = parser.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    src = args.src
    if src is None:
        src = args.work / f"synth-{args.classes}x{args.per_class}"
        make_synthetic(src, classes=args.classes, per_class=args.per_class, val_per_class=0, workers=args.workers)
    if args.replicate > 1:
        src = replicate(src / "train", args.work / f"{src.name}-x{args.replicate}", args.replicate)
    images, size = tree_stats(src / "train")
    print(f"source {src}/train: {images:,} images, {size / 1e6:,.1f} MB; {args.workers} workers; median of {args.repeats}")
    im2rec = im2rec_path(args.mxnet_python) if args.mxnet_python else None
    if im2rec is None:
        print("IMGPIPE_MXNET_PYTHON / --mxnet-python not set: im2rec is not timed")

    modes = [m.strip() for m in args.modes.split(",")]
    if "t" in modes:
        time_tars(src, args.work, args.workers, args.repeats, images)
    out = args.work / "out"
    for mode in (m for m in modes if m != "t"):
        resize = mode.strip() == "b"
        label = "(b) --resize 256 --quality 95" if resize else "(a) keep bytes"
        times: dict[str, list[float]] = {"imgpipe": [], "im2rec": [], "cp -r": [], "cp -r + sync": []}
        for _ in range(args.repeats):
            shutil.rmtree(out, ignore_errors=True)
            times["imgpipe"].append(run_timed(imgpipe_commands(src, out / "imgpipe", args.workers, resize)))
            assert records_in(out / "imgpipe") == images, "imgpipe packed an unexpected number of records"
            if im2rec:
                (out / "im2rec").mkdir(parents=True)
                times["im2rec"].append(run_timed(im2rec_commands(args.mxnet_python, im2rec, src, out / "im2rec" / "train", args.workers, resize)))
                assert records_in(out / "im2rec") == images, "im2rec packed an unexpected number of records"
            if args.cp and not resize:
                times["cp -r"].append(run_timed([["cp", "-r", str(src / "train"), str(out / "cp1")]]))
                times["cp -r + sync"].append(run_timed([["cp", "-r", str(src / "train"), str(out / "cp2")], ["sync"]]))
        print(f"\n{label}")
        medians = {name: statistics.median(t) for name, t in times.items() if t}
        for name, seconds in medians.items():
            print(f"  {name:<13} {seconds:7.2f} s  {images / seconds:9,.0f} images/s  {size / 1e6 / seconds:8,.1f} MB/s"
                  f"   runs: {', '.join(f'{t:.2f}' for t in times[name])}")  # fmt: skip
        for other in ("im2rec", "cp -r", "cp -r + sync"):
            if other in medians:
                print(f"  imgpipe / {other}: {medians[other] / medians['imgpipe']:.2f}x the speed")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
