"""What walking tar headers with ``tarwalk`` saves over ``tarfile`` (guarded), against what a whole pack costs per image.

The data are ImageNet-shaped (``_data``): ``--images`` JPEGs in ``--classes`` classes, written as
image-net.org's train tar (one ``<wnid>.tar`` per class inside; ImageNet's class tars hold 1,281
images on average), as timm's WebDataset shards (three members per sample) and as Hugging Face's
``.tar.gz`` files. Each round lists every class tar, every shard and every ``.tar.gz`` in this one
process, once with ``tarwalk`` (today's ``list_tar``, ``list_shard``, ``list_tar_gz``) and once with
``tarfile`` alone (``CheckedTarInfo``), alternating which goes first; the figure is CPU time per
member (per sample for the shards), the median over rounds. The pack's cost per image is the CPU
time of all processes of ``imgpipe pack`` of the train tar (and of the shards), less that of a
pack of a tar of a few images (start-up, imports), over the images: what ImageNet's 1.28 M pay.

Usage::

    python benchmarks/tar_listing.py                     # 2,600 images, 2 classes, 7 rounds
    python benchmarks/tar_listing.py --images 5200 --classes 4 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from _data import make_imagenet_shaped  # benchmarks/ is on sys.path when run as a script
from _measure import compile_bytecode
from pack_layouts import layout_copy, warm
from pack_vs_im2rec import children_cpu, records_in, run_timed

from imgpipe.ingest import imagenet_tars, streams, webdataset
from imgpipe.ingest.members import ArchiveFile, OpenArchive
from imgpipe.ingest.tarwalk import TarfileWalk

IMAGENET_IMAGES = 1_281_167
TINY_IMAGES = 40


def by_tarfile_only(source: OpenArchive, start: int, size: int, where: str, download: str) -> list:
    """``list_tar`` with every header read by ``tarfile`` (guarded), none by ``tarwalk``."""
    window = imagenet_tars.Window(source, start, size)
    return imagenet_tars._listed(TarfileWalk(window), source, start, size, where, download)  # type: ignore[arg-type]


def class_tars(train: Path) -> list[tuple[int, int]]:
    archive = ArchiveFile.of(train)
    return list(imagenet_tars._class_tars(archive).values())


def list_train(train: Path, spans: list[tuple[int, int]], lister: Callable[..., list]) -> int:
    members = 0
    with OpenArchive(ArchiveFile.of(train)) as source:
        for start, size in spans:
            members += len(lister(source, start, size, str(train), train.name))
    return members


def list_shards(shards: list[Path], lister: Callable[..., list]) -> int:
    saved = webdataset.list_tar
    webdataset.list_tar = lister
    try:
        return sum(webdataset.list_shard(path).samples for path in shards)
    finally:
        webdataset.list_tar = saved


def list_tar_gzs(paths: list[Path], plain: bool) -> int:
    return sum(len(streams._list_tar_gz(path, plain)) for path in paths)


def cpu_of(action: Callable[[], int]) -> tuple[float, int]:
    started = time.process_time()
    count = action()
    return time.process_time() - started, count


def pack_cpu(src: Path, out: Path, workers: int) -> float:
    shutil.rmtree(out, ignore_errors=True)
    began = children_cpu()
    run_timed([[sys.executable, "-m", "imgpipe", "pack", str(src), str(out), "--splits", "train", "--workers", str(workers),
                "--no-progress"]])  # fmt: skip
    return children_cpu() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench", help="scratch folder")
    parser.add_argument("--images", type=int, default=2600)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pack-rounds", type=int, default=3)
    args = parser.parse_args()
    compile_bytecode()
    args.work.mkdir(parents=True, exist_ok=True)
    tree = make_imagenet_shaped(args.work / f"imagenet-shaped-{args.images}-{args.classes}", args.images, args.classes, args.workers)
    tiny = make_imagenet_shaped(args.work / f"imagenet-shaped-{TINY_IMAGES}-{args.classes}", TINY_IMAGES, args.classes, args.workers)
    layouts = {name: layout_copy(tree, args.work, name) for name in ("split-tar", "wds", "hf-tar")}
    tiny_layouts = {name: layout_copy(tiny, args.work, name) for name in ("split-tar", "wds")}
    train = args.work / f"train-tar-{args.images}-{args.classes}" / imagenet_tars.TRAIN_TAR  # the split parts joined: one tar
    if not train.is_file():
        train.parent.mkdir(parents=True, exist_ok=True)
        with open(train, "wb") as f:
            for part in sorted(layouts["split-tar"].glob(f"{imagenet_tars.TRAIN_TAR}.*")):
                f.write(part.read_bytes())
    shards = sorted(layouts["wds"].glob("*-train-*.tar"))
    tar_gzs = sorted((layouts["hf-tar"] / "data").glob("train_images_*.tar.gz"))
    for folder in (train.parent, layouts["wds"], layouts["hf-tar"]):
        warm(folder)
    spans = class_tars(train)

    cases: dict[str, dict[str, Callable[[], int]]] = {
        "class tars (per member)": {
            "tarwalk": lambda: list_train(train, spans, imagenet_tars.list_tar),
            "tarfile": lambda: list_train(train, spans, by_tarfile_only),
        },
        "wds shards (per sample)": {
            "tarwalk": lambda: list_shards(shards, imagenet_tars.list_tar),
            "tarfile": lambda: list_shards(shards, by_tarfile_only),
        },
        "hf .tar.gz (per member)": {"tarwalk": lambda: list_tar_gzs(tar_gzs, True), "tarfile": lambda: list_tar_gzs(tar_gzs, False)},
    }
    costs: dict[str, dict[str, list[float]]] = {case: {"tarwalk": [], "tarfile": []} for case in cases}
    for k in range(args.rounds):
        for case, ways in cases.items():
            for way in ("tarwalk", "tarfile") if k % 2 == 0 else ("tarfile", "tarwalk"):
                seconds, count = cpu_of(ways[way])
                costs[case][way].append(seconds / count * 1e6)

    out = args.work / "out-tar-listing"
    per_image: dict[str, list[float]] = {"split-tar": [], "wds": []}
    for _ in range(args.pack_rounds):
        for name in per_image:
            full = pack_cpu(layouts[name], out, args.workers)
            assert records_in(out) == args.images
            small = pack_cpu(tiny_layouts[name], out, args.workers)
            per_image[name].append((full - small) / (args.images - TINY_IMAGES) * 1e6)
    shutil.rmtree(out, ignore_errors=True)

    print(f"{args.images:,} ImageNet-shaped images in {args.classes} classes; {args.rounds} listing rounds, {args.pack_rounds} pack rounds")
    print("listing, CPU us (median over rounds): tarwalk / tarfile / saved")
    saved: dict[str, float] = {}
    for case in cases:
        walk, plain = statistics.median(costs[case]["tarwalk"]), statistics.median(costs[case]["tarfile"])
        saved[case] = plain - walk
        rounds = "; ".join(f"{way} " + ", ".join(f"{c:.1f}" for c in costs[case][way]) for way in ("tarwalk", "tarfile"))
        print(f"  {case:<24} {walk:6.1f} / {plain:6.1f} / {plain - walk:5.1f}   rounds {rounds}")
    for name, case in (("split-tar", "class tars (per member)"), ("wds", "wds shards (per sample)")):
        cost = statistics.median(per_image[name])
        print(f"pack of the {name} layout: {cost:.0f} us CPU per image (all processes, start-up taken out; rounds "
              f"{', '.join(f'{c:.0f}' for c in per_image[name])}); tarwalk saves {saved[case]:.1f} us = {saved[case] / cost:.1%} of it, "
              f"{saved[case] * IMAGENET_IMAGES / 1e6:.0f} CPU-seconds on ImageNet's train split")  # fmt: skip


if __name__ == "__main__":
    main()
