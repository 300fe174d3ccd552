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
inside its single .rec). The two tools run in alternation (imgpipe, im2rec, imgpipe, ...);
medians over ``--repeats`` runs, and the median of the ratios within each pair, which a
machine shared with other work disturbs less. Mode (b) also prints the per-core limit: decode
+ antialiased resize + encode in one process (``per_core_limit``).

The default source is ImageNet-shaped (``_data.make_imagenet_shaped``): synth's pictures at
ImageNet's sizes (long side 500, mostly 4:3, 2.5 % with a long side of 1,000-2,400 px) and
file sizes (quality 95: ~110 KB median); ``imgpipe synth``'s own defaults are smaller (sides
300-500 px, ~80 KB) and square on average.

Usage::

    python benchmarks/pack_vs_im2rec.py                       # 3,000 ImageNet-shaped JPEGs (~330 MB)
    python benchmarks/pack_vs_im2rec.py --data synth          # imgpipe synth's defaults, 20 classes x 50
    python benchmarks/pack_vs_im2rec.py --replicate 11 --modes a --cp   # a >= 1 GB tree, vs cp -r
    python benchmarks/pack_vs_im2rec.py --modes t             # from the tars vs from the extracted tree
    IMGPIPE_MXNET_PYTHON=/path/to/mxnet/venv/bin/python python benchmarks/pack_vs_im2rec.py --src SRC
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _data import describe_tree, make_imagenet_shaped  # benchmarks/ is on sys.path when run as a script
from _measure import compile_bytecode
from PIL import Image

from imgpipe.image import shrink
from imgpipe.image.codec import _short_side_size
from imgpipe.synth.tree import make_synthetic


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


# ----------------------------------------------------------------------------- ImageNet-shaped data and the per-core limit


def per_core_limit(train: Path, short: int = 256, quality: int = 95, limit: int = 600) -> dict[str, float]:
    """Images/s of one process, files already in memory: decode + antialiased resize + encode.

    ``pillow``: ``draft`` (libjpeg's 1/2, 1/4, 1/8, as pack), ``resize(BILINEAR)``, ``save``: Pillow's
    libjpeg-turbo. ``libjpeg-turbo``: the same work in one C call (``imgpipe.image.shrink``), which is
    what pack runs for a clean JPEG. Images whose shorter side is already ``short`` are skipped,
    as pack keeps them.
    """
    payloads = []
    for path in sorted(p for p in train.rglob("*") if p.is_file())[:limit]:
        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            if min(image.size) > short:
                payloads.append((data, image.size, _short_side_size(image.size, short)))

    def pillow(data: bytes, size: tuple[int, int], target: tuple[int, int]) -> bytes:
        with Image.open(io.BytesIO(data)) as image:
            image.draft("RGB", shrink.draft_size(target))
            out = io.BytesIO()
            image.convert("RGB").resize(target, Image.Resampling.BILINEAR).save(out, "JPEG", quality=quality)
            return out.getvalue()

    def c_call(data: bytes, size: tuple[int, int], target: tuple[int, int]) -> bytes | None:
        return shrink.shrink_jpeg(data, size, target, quality)

    rates = {}
    for name, work in (("pillow", pillow), ("libjpeg-turbo", c_call)):
        if name == "libjpeg-turbo" and not shrink.available():
            continue
        started = time.process_time()
        for payload in payloads:
            work(*payload)
        rates[name] = len(payloads) / (time.process_time() - started)
    return rates


def dct_scale_costs(train: Path, short: int = 256, quality: int = 95, limit: int = 300) -> dict[str, float]:
    """Milliseconds per image of ``imgpipe.image.shrink`` decoding at 6/8, 7/8 and 8/8, on the images whose
    shorter side is 4/3-2x ``short`` (so 6/8 still covers the target; most of ImageNet): libjpeg-turbo's
    M/8 scales other than 1/2, 1/4, 1/8 have no SIMD IDCT, and this shows whether they still pay."""
    if not shrink.available():
        return {}
    payloads = []
    for path in sorted(p for p in train.rglob("*") if p.is_file())[:limit]:
        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            if short * 4 / 3 <= min(image.size) < 2 * short:
                payloads.append((data, _short_side_size(image.size, short)))
    costs = {}
    for m in (6, 7, 8):
        started = time.process_time()
        for data, (width, height) in payloads:
            shrink._shrink(data, m, width, height, quality)
        costs[f"{m}/8"] = (time.process_time() - started) / max(len(payloads), 1) * 1e3
    return costs


def children_cpu() -> float:
    """CPU seconds (user + sys) of all finished child processes so far: a cost that other load on the machine barely changes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def median_pair_ratio(imgpipe_times: list[float], im2rec_times: list[float]) -> float:
    """Median over the interleaved runs of im2rec's time / imgpipe's time in the same pair: a shared machine's load cancels."""
    return statistics.median(b / a for a, b in zip(imgpipe_times, im2rec_times))


def time_tars(src: Path, work: Path, workers: int, repeats: int, images: int) -> None:
    """Mode t: keep-bytes pack from the train tar (read in place) vs from the extracted tree, runs interleaved."""
    from imgpipe.synth.tars import write_imagenet_tars

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
    parser.add_argument("--src", type=Path, help="tree with train/<class>/* (default: a generated one, made once)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench", help="scratch folder")
    parser.add_argument("--data", choices=["imagenet", "synth"], default="imagenet",
                        help="generated tree: ImageNet's sizes and file sizes (--images), "
                             "or imgpipe synth's defaults (--classes x --per-class)")  # fmt: skip
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--replicate", type=int, default=1, help="copies of each image (e.g. 11 gives ~1 GB from the default)")
    parser.add_argument("--workers", type=int, default=min(4, len(os.sched_getaffinity(0))))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="a,b", help="a (keep bytes), b (resize 256, quality 95), t (from the tars), e.g. a,b,t")
    parser.add_argument("--cp", action="store_true", help="also time cp -r of the train tree (mode a)")
    parser.add_argument("--mxnet-python", default=os.environ.get("IMGPIPE_MXNET_PYTHON"), help="python of the MXNet venv")
    args = parser.parse_args()
    compile_bytecode()

    args.work.mkdir(parents=True, exist_ok=True)
    src = args.src
    if src is None and args.data == "imagenet":
        src = make_imagenet_shaped(args.work / f"imagenet-shaped-{args.images}", args.images, args.classes, args.workers)
    elif src is None:
        src = args.work / f"synth-{args.classes}x{args.per_class}"
        make_synthetic(src, classes=args.classes, per_class=args.per_class, val_per_class=0, workers=args.workers)
    if args.replicate > 1:
        src = replicate(src / "train", args.work / f"{src.name}-x{args.replicate}", args.replicate)
    images, size = tree_stats(src / "train")
    print(f"source {src}/train: {images:,} images, {size / 1e6:,.1f} MB ({describe_tree(src / 'train')}); "
          f"{args.workers} workers; median of {args.repeats}")  # fmt: skip
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
        cpu_times: dict[str, list[float]] = {"imgpipe": [], "im2rec": []}
        for _ in range(args.repeats):
            shutil.rmtree(out, ignore_errors=True)
            cpu = children_cpu()
            times["imgpipe"].append(run_timed(imgpipe_commands(src, out / "imgpipe", args.workers, resize)))
            cpu_times["imgpipe"].append(children_cpu() - cpu)
            assert records_in(out / "imgpipe") == images, "imgpipe packed an unexpected number of records"
            if im2rec:
                (out / "im2rec").mkdir(parents=True)
                cpu = children_cpu()
                times["im2rec"].append(
                    run_timed(im2rec_commands(args.mxnet_python, im2rec, src, out / "im2rec" / "train", args.workers, resize))
                )
                cpu_times["im2rec"].append(children_cpu() - cpu)
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
        if times["im2rec"]:
            print(f"  imgpipe / im2rec, median of the per-pair ratios: {median_pair_ratio(times['imgpipe'], times['im2rec']):.2f}x")
            print(f"  CPU seconds (user + sys, all processes): imgpipe {statistics.median(cpu_times['imgpipe']):.2f}, "
                  f"im2rec {statistics.median(cpu_times['im2rec']):.2f}; "
                  f"per-pair ratio {median_pair_ratio(cpu_times['imgpipe'], cpu_times['im2rec']):.2f}x")  # fmt: skip
        if resize:
            per_core = per_core_limit(src / "train")
            pack_per_core = images / medians["imgpipe"] / args.workers
            print(f"  per core, one process, files in memory: {', '.join(f'{k} {v:,.0f}' for k, v in per_core.items())} images/s;"
                  f" imgpipe pack (whole command) {pack_per_core:,.0f} images/s per worker")  # fmt: skip
            scales = dct_scale_costs(src / "train")
            if scales:
                print(f"  libjpeg-turbo decode scale, ms per 500x375-like image: {', '.join(f'{k} {v:.2f}' for k, v in scales.items())}")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
