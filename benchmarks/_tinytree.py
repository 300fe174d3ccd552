"""ImageNet's file count with tiny images: ``train/<wnid>/<wnid>_<k>.JPEG`` and a flat ``val/`` with its
``LOC_val_solution.csv``, each file a 24-40 px JPEG (~1 KB), so that only the count is large.

Written by one process, a class at a time, each class's files in a shuffled order (as a class
tar extracts: its members are not in name order), so name order is not disk order. The bytes
come from a pool of pre-encoded pictures: 1.33 M files take a minute or two, not an hour.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image

from imgpipe.synth.tree import make_wnids

POOL = 512
MARKER = ".complete"


def _pool(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    pictures = []
    for _ in range(POOL):
        width, height = (int(v) for v in rng.integers(24, 41, size=2))
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        pictures.append(buffer.getvalue())
    return pictures


def make_tiny_tree(out: Path, classes: int, per_class: int, val: int, seed: int = 0) -> Path:
    """The tree in ``out`` (made once: a finished one is kept); returns ``out``."""
    if (out / MARKER).exists():
        return out
    rng = np.random.default_rng([seed, 1])
    pictures = _pool(seed)
    wnids = make_wnids(classes, seed)
    for wnid in wnids:
        folder = out / "train" / wnid
        folder.mkdir(parents=True, exist_ok=True)
        for k in rng.permutation(per_class).tolist():
            (folder / f"{wnid}_{k}.JPEG").write_bytes(pictures[int(rng.integers(POOL))])
    rows = ["ImageId,PredictionString"]
    if val:
        (out / "val").mkdir(parents=True, exist_ok=True)
        for k in (rng.permutation(val) + 1).tolist():
            (out / "val" / f"ILSVRC2012_val_{k:08d}.JPEG").write_bytes(pictures[int(rng.integers(POOL))])
            rows.append(f"ILSVRC2012_val_{k:08d},{wnids[k % classes]} 0 0 1 1")
    (out / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    os.sync()
    (out / MARKER).touch()
    return out


def count_files(out: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(out)) - 2  # the CSV and the marker
