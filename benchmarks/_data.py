"""ImageNet-shaped benchmark data, shared by the benchmarks: synth's pictures at ImageNet's sizes and file sizes.

ImageNet's train images mostly have a long side of 500 px, 4:3 or 3:2, most landscape, 2-3 % are
larger than 1,000 px, and the median file is ~110 KB; ``imgpipe synth``'s own defaults are smaller
(sides 300-500 px, ~80 KB) and square on average, which flatters a decoder.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from imgpipe.synth.tree import class_image, make_wnids

IMAGENET_QUALITY = 95  # with synth's pictures: ~108 KB at 500x375, near ImageNet's median file
IMAGENET_LARGE = 0.025  # share of images with a long side of 1,000-2,400 px
IMAGENET_ASPECTS = ((4 / 3, 0.6), (3 / 2, 0.25), (5 / 4, 0.1), (1.0, 0.05))


def imagenet_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) as ImageNet's train images mostly are: long side 500, 4:3 or 3:2, most landscape."""
    aspects, weights = zip(*IMAGENET_ASPECTS)
    aspect = float(rng.choice(aspects, p=weights))
    if rng.random() < IMAGENET_LARGE:
        long_side = int(rng.integers(1000, 2401))
    else:
        long_side = 500 if rng.random() < 0.85 else int(rng.integers(300, 500))
    short_side = round(long_side / aspect)
    return (long_side, short_side) if rng.random() < 0.75 else (short_side, long_side)


def _imagenet_image(task: tuple[Path, int, int, int, int]) -> None:
    out, classes, label, k, seed = task
    rng = np.random.default_rng([seed, label, k])
    width, height = imagenet_size(rng)
    Image.fromarray(class_image(rng, label, classes, width, height)).save(out, "JPEG", quality=IMAGENET_QUALITY)


def make_imagenet_shaped(out: Path, images: int, classes: int, workers: int, seed: int = 0) -> Path:
    """``out/train/<wnid>/*.JPEG``: ``images`` synth pictures at ImageNet's sizes and file sizes; made once."""
    done = out / ".complete"
    if done.exists():
        return out
    wnids = make_wnids(classes, seed)
    tasks = []
    for k in range(images):
        label = k % classes
        folder = out / "train" / wnids[label]
        folder.mkdir(parents=True, exist_ok=True)
        tasks.append((folder / f"{wnids[label]}_{k}.JPEG", classes, label, k, seed))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_imagenet_image, tasks, chunksize=16))
    done.touch()
    return out


def describe_tree(train: Path) -> str:
    """Median size and file size, and the share of images above 1,000 px, of a class-folder tree."""
    sizes, files = [], []
    for path in sorted(train.rglob("*")):
        if path.is_file():
            files.append(path.stat().st_size)
            with Image.open(path) as image:
                sizes.append(image.size)
    areas = [w * h for w, h in sizes]
    median = sizes[sorted(range(len(sizes)), key=areas.__getitem__)[len(sizes) // 2]]
    large = sum(max(s) > 1000 for s in sizes) / len(sizes)
    return f"median {median[0]}x{median[1]} px, median file {statistics.median(files) / 1e3:.0f} KB, {large:.1%} above 1,000 px"
