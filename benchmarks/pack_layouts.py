"""Pass-through ``imgpipe pack`` from each download layout vs from the extracted tree, same images, same options.

Layouts: image-net.org's train tar in parts (split-tar), timm's WebDataset shards (wds),
Kaggle's zip (kaggle-zip, deflated members as ``zip`` makes them; kaggle-zip-stored, the same
zip with its members stored), Hugging Face's Parquet (hf-parquet) and
tar.gz (hf-tar); each is written once from the ImageNet-shaped tree (``_data``) by
``imgpipe.synth.layouts``. Every run is a whole ``imgpipe pack SRC DST --splits train`` in a
fresh process into a fresh DST (so the Parquet and tar.gz listings are made each time), with
the page cache warm. Runs are interleaved (tree, then every layout, per round) and each
layout's figure is the median over rounds of tree time / layout time measured in the same
round, which load from other work on the machine disturbs less; CPU seconds (all processes)
are reported the same way.

For hf-tar and hf-parquet the time is split: the listing (a full decompression of every .tar.gz,
or of every Parquet page of the images, before the plan can exist), and the decompression alone
per image (one process; ISA-L's inflate when python-isal is installed, else zlib's).

Usage::

    python benchmarks/pack_layouts.py                  # 3,000 ImageNet-shaped JPEGs, 2 workers, 5 rounds
    python benchmarks/pack_layouts.py --layouts wds,hf-tar --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from _data import describe_tree, make_imagenet_shaped  # benchmarks/ is on sys.path when run as a script
from _measure import compile_bytecode
from pack_vs_im2rec import children_cpu, records_in, run_timed, tree_stats

from imgpipe.ingest.kaggle_zip import KAGGLE_ZIP

LAYOUTS = ("split-tar", "wds", "kaggle-zip", "kaggle-zip-stored", "hf-parquet", "hf-tar")


def layout_copy(tree: Path, work: Path, layout: str) -> Path:
    """The tree written in ``layout`` (once; reused by later runs)."""
    from imgpipe.synth.layouts import write_layout

    out = work / f"{tree.name}-{layout}"
    done = out / ".complete"
    if not done.exists():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        if layout == "kaggle-zip-stored":  # the same zip with its members stored, not deflated
            deflated = layout_copy(tree, work, "kaggle-zip") / KAGGLE_ZIP
            with zipfile.ZipFile(deflated) as source, zipfile.ZipFile(out / KAGGLE_ZIP, "w", zipfile.ZIP_STORED) as target:
                for info in source.infolist():
                    target.writestr(info.filename, source.read(info), compress_type=zipfile.ZIP_STORED)
        else:
            write_layout(tree, out, layout, sorted(p.name for p in (tree / "train").iterdir()), seed=0)
        done.touch()
    return out


def pack_command(src: Path, dst: Path, workers: int) -> list[list[str]]:
    return [[sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), "--splits", "train", "--workers", str(workers),
             "--shards", str(4 * workers), "--no-progress"]]  # fmt: skip


def warm(folder: Path) -> int:
    """Read every file once (the page cache starts warm for every source alike); return the bytes."""
    return sum(len(p.read_bytes()) for p in folder.rglob("*") if p.is_file())


def stream_split(layout: str, src: Path, images: int, workers: int) -> None:
    """Where a stream layout's extra time goes: the listing pass, and the reading that both passes repeat (one process)."""
    from imgpipe.ingest import fastzlib
    from imgpipe.ingest.scan import scan

    started = time.process_time(), time.perf_counter()
    scan(src, ["train"], workers)
    cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
    runners = "processes" if layout == "hf-tar" else "threads"
    listing = f"listing pass {wall:.2f} s ({workers} {runners}; {cpu / images * 1e6:.0f} us CPU per image in this process)"
    began = time.process_time()
    if layout == "hf-tar":
        buffer = bytearray(1 << 20)
        for path in sorted((src / "data").glob("train_images_*.tar.gz")):
            with open(path, "rb") as raw, fastzlib.open_gzip(raw) as stream:
                while stream.readinto(buffer):  # type: ignore[attr-defined]
                    pass
        per_image = (time.process_time() - began) / images * 1e6
        print(f"  hf-tar: {listing}; inflate alone ({fastzlib.BACKEND}) {per_image:.0f} us CPU per image, "
              "paid twice (listing, then packing)")  # fmt: skip
    else:
        import pyarrow.parquet as pq

        from imgpipe.ingest.parquet import page_reader, row_group_images

        for path in sorted((src / "data").glob("train-*.parquet")):
            parquet = pq.ParquetFile(path)
            pages = page_reader(path, parquet)
            for group in range(parquet.metadata.num_row_groups):
                _sizes = row_group_images(path, parquet, pages, group).sizes  # what the listing pass computes
        per_image = (time.process_time() - began) / images * 1e6
        print(f"  hf-parquet: {listing}; pages decompressed and walked {per_image:.0f} us CPU per image, "
              "paid twice (listing, then packing)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench", help="scratch folder")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, from {', '.join(LAYOUTS)}")
    args = parser.parse_args()
    compile_bytecode()
    layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]

    args.work.mkdir(parents=True, exist_ok=True)
    tree = make_imagenet_shaped(args.work / f"imagenet-shaped-{args.images}", args.images, args.classes, args.workers)
    images, size = tree_stats(tree / "train")
    sources = {"tree": tree, **{layout: layout_copy(tree, args.work, layout) for layout in layouts}}
    print(f"source {tree}/train: {images:,} images, {size / 1e6:,.1f} MB ({describe_tree(tree / 'train')}); "
          f"{args.workers} workers; {args.rounds} rounds; host load {os.getloadavg()[0]:.1f}")  # fmt: skip
    out = args.work / "out-layouts"
    wall: dict[str, list[float]] = {name: [] for name in sources}
    cpu: dict[str, list[float]] = {name: [] for name in sources}
    for _ in range(args.rounds):
        for name, src in sources.items():
            warm(src)
            shutil.rmtree(out, ignore_errors=True)
            began = children_cpu()
            wall[name].append(run_timed(pack_command(src, out, args.workers)))
            cpu[name].append(children_cpu() - began)
            assert records_in(out) == images, f"pack from {name} packed an unexpected number of records"
    shutil.rmtree(out, ignore_errors=True)
    print("\npass-through pack, median of rounds; speed = tree time / layout time in the same round (median over rounds)")
    print(f"  {'layout':<11} {'wall s':>7} {'images/s':>9} {'speed':>7} {'CPU s':>7} {'CPU ratio':>9}   runs")
    for name in sources:
        speed = statistics.median(t / s for t, s in zip(wall["tree"], wall[name]))
        cpu_ratio = statistics.median(t / s for t, s in zip(cpu["tree"], cpu[name]))
        seconds = statistics.median(wall[name])
        print(f"  {name:<11} {seconds:7.2f} {images / seconds:9,.0f} {speed:6.2f}x {statistics.median(cpu[name]):7.2f} {cpu_ratio:8.2f}x"
              f"   {', '.join(f'{t:.2f}' for t in wall[name])}")  # fmt: skip
    for layout in ("hf-parquet", "hf-tar"):
        if layout in sources:
            stream_split(layout, sources[layout], images, args.workers)


if __name__ == "__main__":
    main()
