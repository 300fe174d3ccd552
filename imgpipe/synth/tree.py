"""A deterministic, ImageNet-shaped synthetic dataset: the embedded default for demos and tests.

It writes ``train/<wnid>/<wnid>_<k>.JPEG``, a flat ``val/`` with ``LOC_val_solution.csv`` and, last,
``.imgpipe-synth.json``, or the same images in a download ``layout`` (``synth.tars``, ``synth.layouts``).
Each image comes from its own generator seeded by (seed, split, class, k), so the bytes depend only on
the arguments. Pictures look like photos to a JPEG codec (about 70 KB at 300-500 px and quality 90, and
a ~3% tail of 2-4.8x larger ones, 1000-2400 px: a mean near 95 KB at the defaults) and carry the class
in a hue pair and a stripe pattern a small CNN learns quickly; ``quirks=True`` adds a crawl's odd files.
"""

from __future__ import annotations

import colorsys
import io
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.jsonfile import as_dataclass, read_json
from imgpipe._sys.procs import map_in_processes
from imgpipe.errors import DatasetError

logger = logging.getLogger(__name__)

MARKER = ".imgpipe-synth.json"
TAR_TREE = ".imgpipe-synth-tree"  # where another layout is written as a tree before it is archived
JPEG_QUALITY = 90
LARGE_EVERY = 33  # one image in 33 (~3%) is large
LARGE_LONG_SIDE = (2.0, 4.8)  # times max_side: 1000-2400 px at the default 500
TRAIN, VAL, QUIRK = 0, 1, 2  # split codes in the per-image seed
# Quirk name -> what `imgpipe pack` should do with it.
QUIRKS = {
    "cmyk": "repaired",
    "grayscale": "repaired",
    "grayscale_progressive": "repaired",
    "png_named_jpeg": "repaired",
    "exif_rotated": "repaired",
    "truncated": "skipped",
    "empty": "skipped",
    "not_an_image": "skipped",
}
NOT_AN_IMAGE = b"<html><head><title>404 Not Found</title></head><body>photo unavailable</body></html>\n"


@dataclass
class SynthSummary:
    """What ``make_synthetic`` wrote: classes, counts, bytes and the quirk files (relative paths)."""

    root: str
    classes: list[str]
    train_images: int
    val_images: int
    bytes: int
    quirk_files: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        quirks = f", {len(self.quirk_files)} quirk files" if self.quirk_files else ""
        return (
            f"{self.root}: {len(self.classes)} classes, {self.train_images} train + {self.val_images} val images"
            f"{quirks}, {self.bytes / 1e6:.1f} MB"
        )


@dataclass(frozen=True)
class _Job:
    split: int
    label: int
    k: int
    path: str  # relative to the output folder
    quirk: str | None = None


def make_synthetic(
    out: str | os.PathLike,
    *,
    classes: int = 10,
    per_class: int = 50,
    val_per_class: int = 10,
    seed: int = 0,
    quirks: bool = False,
    min_side: int = 300,
    max_side: int = 500,
    workers: int = 1,
    progress: bool = True,
    tars: bool = False,
    layout: str = "tree",
    source: str | os.PathLike | None = None,
) -> SynthSummary:
    """Write the synthetic tree into ``out`` (new or empty); rerunning with the same arguments is a no-op.

    ``layout`` other than ``tree`` writes the same images as a publisher ships them instead,
    and no folders (``synth.layouts.LAYOUTS``); ``tars=True`` is ``layout="tarballs"``:
    image-net.org's train and val tars and the devkit. ``source``, a tree this function wrote
    with the same arguments, is what such a layout is written from instead of a new tree.
    """
    from imgpipe.synth.layouts import LAYOUTS

    layout = "tarballs" if tars else layout
    if layout not in LAYOUTS:
        raise DatasetError(f"synth: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if classes < 1 or per_class < 0 or val_per_class < 0:
        raise DatasetError(f"synth: need classes >= 1 and non-negative counts, got {classes}, {per_class}, {val_per_class}")
    if not 8 <= min_side <= max_side:
        raise DatasetError(f"synth: need 8 <= min_side <= max_side, got {min_side}, {max_side}")
    out = Path(out)
    args = dict(classes=classes, per_class=per_class, val_per_class=val_per_class, seed=seed, quirks=quirks,
                min_side=min_side, max_side=max_side)  # fmt: skip
    existing = _existing_summary(out, _recorded_args(args, layout))
    if existing is not None:
        logger.info("%s already holds this synthetic dataset; nothing to do", out)
        return existing
    if layout != "tree":
        return _make_layout(out, args, layout, workers, progress, None if source is None else Path(source))
    if source is not None:
        raise DatasetError(f"synth: --from {source} writes that tree in another --layout; give one, or drop --from")
    wnids = make_wnids(classes, seed)
    jobs = list(_plan(wnids, per_class, val_per_class, seed, quirks))
    folders = {*(f"train/{wnid}" for wnid in wnids), *(str(Path(j.path).parent) for j in jobs)}
    try:  # every class folder, even an empty one: the tree stays an ImageNet layout with any counts
        for folder in sorted(folders):
            (out / folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"{out}: cannot create the output folder ({e.strerror}); choose another folder") from None
    sizes = dict(min_side=min_side, max_side=max_side)
    total = 0
    tasks = [(out, job, classes, seed, sizes) for job in jobs]
    for size in map_in_processes(_write_one, tasks, workers=workers, chunksize=8, desc="synth", unit="img", progress=progress):
        total += size
    val_jobs = [j for j in jobs if j.split == VAL]
    csv = _val_csv(val_jobs, wnids, seed) if val_jobs else b""
    if val_jobs:
        atomic_write_bytes(out / "LOC_val_solution.csv", csv)
    summary = SynthSummary(
        root=str(out),
        classes=wnids,
        train_images=sum(j.split != VAL for j in jobs),
        val_images=len(val_jobs),
        bytes=total + len(csv),
        quirk_files={j.quirk: j.path for j in jobs if j.quirk},
    )
    recorded = {k: v for k, v in asdict(summary).items() if k != "root"}  # no path: the tree stays byte-identical anywhere
    atomic_write_bytes(out / MARKER, json.dumps({"args": args, "summary": recorded}, indent=1).encode())
    return summary


def _recorded_args(args: dict, layout: str) -> dict:
    """The arguments the marker records: a tree's as given, others with their layout (the tarballs' as ``tars``)."""
    if layout == "tree":
        return args
    return {**args, "tars": True} if layout == "tarballs" else {**args, "layout": layout}


def _make_layout(out: Path, args: dict, layout: str, workers: int, progress: bool, source: Path | None) -> SynthSummary:
    """Write the tree (``source``, or a new one in a hidden folder of ``out``, removed after) out in ``layout``."""
    from imgpipe.synth.layouts import write_layout
    from imgpipe.synth.tars import write_imagenet_tars

    tree = out / TAR_TREE if source is None else source
    summary = make_synthetic(tree, **args, workers=workers, progress=progress) if source is None else _source_tree(source, args)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"{out}: cannot create the output folder ({e.strerror}); choose another folder") from None
    if layout == "tarballs":
        total = write_imagenet_tars(tree, out, summary.classes, args["seed"])
    else:
        total = write_layout(tree, out, layout, summary.classes, args["seed"])
    if source is None:
        shutil.rmtree(tree)
    summary = SynthSummary(str(out), summary.classes, summary.train_images, summary.val_images, total, summary.quirk_files)
    recorded = {k: v for k, v in asdict(summary).items() if k != "root"}
    atomic_write_bytes(out / MARKER, json.dumps({"args": _recorded_args(args, layout), "summary": recorded}, indent=1).encode())
    return summary


def _source_tree(source: Path, args: dict) -> SynthSummary:
    """The summary of ``source``, a tree synth wrote with ``args``; a DatasetError says what else it is."""
    try:
        fix = "give a tree imgpipe synth wrote, or drop --from"
        written, summary = read_json(source / MARKER, "synth marker", fix, DatasetError, _marker)
    except (FileNotFoundError, NotADirectoryError):
        raise DatasetError(f"{source}: not a tree imgpipe synth wrote (no {MARKER}); give one, or drop --from") from None
    if written != args:
        raise DatasetError(f"{source}: imgpipe synth wrote it with other arguments ({written}); give those, or drop --from")
    return replace(summary, root=str(source))


def _marker(value: object) -> tuple[dict, SynthSummary]:
    """The arguments and the summary a ``MARKER`` records (its decoded JSON); a ValueError for anything else."""
    if not isinstance(value, dict) or not isinstance(value.get("args"), dict) or not isinstance(value.get("summary"), dict):
        raise ValueError("not an object of args and summary")
    return value["args"], as_dataclass(SynthSummary, {**value["summary"], "root": ""})


def make_wnids(count: int, seed: int) -> list[str]:
    """``count`` distinct, sorted ImageNet-style wnids (``n%08d``) drawn from ``seed``."""
    rng = np.random.default_rng([seed, 7])
    numbers = rng.choice(np.arange(1_000_000, 15_000_000), size=count, replace=False)
    return [f"n{n:08d}" for n in sorted(numbers.tolist())]


def _existing_summary(out: Path, args: dict) -> SynthSummary | None:
    if not out.exists():
        return None
    if not out.is_dir():
        raise DatasetError(f"{out}: exists and is not a folder; choose another output folder")
    marker = out / MARKER
    if marker.is_file():
        written, summary = read_json(marker, "synth marker", f"delete {out} and rerun synth", DatasetError, _marker)
        if written == args:
            return replace(summary, root=str(out))
        raise DatasetError(f"{out}: holds a synthetic dataset made with other arguments ({written}); delete it or choose another folder")
    if any(out.iterdir()):
        raise DatasetError(f"{out}: folder is not empty (or an earlier synth was interrupted); delete it or choose another folder")
    return None


def _plan(wnids: list[str], per_class: int, val_per_class: int, seed: int, quirks: bool) -> Iterator[_Job]:
    for label, wnid in enumerate(wnids):
        for k in range(per_class):
            yield _Job(TRAIN, label, k, f"train/{wnid}/{wnid}_{k}.JPEG")
    if quirks:
        for i, name in enumerate(QUIRKS):
            label = i % len(wnids)
            k = per_class + i // len(wnids)
            yield _Job(QUIRK, label, i, f"train/{wnids[label]}/{wnids[label]}_{k}.JPEG", quirk=name)
    labels = np.repeat(np.arange(len(wnids)), val_per_class)
    np.random.default_rng([seed, 11]).shuffle(labels)
    for k, label in enumerate(labels.tolist(), start=1):
        yield _Job(VAL, label, k, f"val/ILSVRC2012_val_{k:08d}.JPEG")


def _write_one(task: tuple[Path, _Job, int, int, dict]) -> int:
    out, job, classes, seed, sizes = task
    rng = np.random.default_rng([seed, job.split, job.label, job.k])
    width, height = _image_size(rng, job, seed, **sizes)
    pixels = class_image(rng, job.label, classes, width, height)
    data = _quirk_bytes(job.quirk, pixels, rng) if job.quirk else _encode(Image.fromarray(pixels))
    (out / job.path).write_bytes(data)
    return len(data)


def _image_size(rng: np.random.Generator, job: _Job, seed: int, *, min_side: int, max_side: int) -> tuple[int, int]:
    """(width, height): both sides uniform in [min_side, max_side], except a fixed ~3% of 2-4.8x larger images."""
    position = job.label * 100_003 + job.k * 7 + job.split
    if job.quirk is None and (position + seed) % LARGE_EVERY == LARGE_EVERY - 1:
        low, high = (round(f * max_side) for f in LARGE_LONG_SIDE)
        long_side = int(rng.integers(low, high + 1))
        short_side = int(long_side / rng.uniform(1.25, 1.6))
        return (long_side, short_side) if rng.random() < 0.7 else (short_side, long_side)
    width, height = rng.integers(min_side, max_side + 1, size=2).tolist()
    return width, height


def class_image(rng: np.random.Generator, label: int, classes: int, width: int, height: int) -> np.ndarray:
    """An HxWx3 uint8 picture of class ``label``: its hue pair and stripe pattern, with per-image jitter."""
    hue = (label / classes + rng.normal(0, 0.01)) % 1.0
    light = np.array(colorsys.hsv_to_rgb(hue, 0.75, 0.9), np.float32) * 255
    dark = np.array(colorsys.hsv_to_rgb((hue + 0.45) % 1.0, 0.6, 0.45), np.float32) * 255
    angle = (label * 2.399963) % np.pi + rng.normal(0, 0.08)  # golden-angle steps: distinct orientations
    cycles = 4 + (label * 7) % 9 + rng.uniform(-0.5, 0.5)  # stripes across the longer side
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    longest = max(width, height)
    along = x * np.float32(np.cos(angle) * width / longest) + y * np.float32(np.sin(angle) * height / longest)
    stripes = np.tanh(3 * np.sin(np.float32(2 * np.pi * cycles) * along + np.float32(rng.uniform(0, 2 * np.pi))))
    slope = rng.uniform(0, 2 * np.pi)
    gradient = x * np.float32(np.cos(slope)) + y * np.float32(np.sin(slope))
    mix = 0.5 + 0.3 * stripes + 0.3 * (gradient - 0.5) + 0.4 * (_smooth_noise(rng, width, height, 24) - 0.5)
    for _ in range(3):  # soft blobs, lighter or darker
        cy, cx = rng.random(2)
        radius = rng.uniform(0.05, 0.2)
        bump = np.outer(np.exp(-((y[:, 0] - cy) ** 2) / (2 * radius**2)), np.exp(-((x[0] - cx) ** 2) / (2 * radius**2)))
        mix += np.float32(rng.choice([-0.5, 0.5])) * bump.astype(np.float32)
    np.clip(mix, 0, 1, out=mix)
    palette = (light + (dark - light) * np.linspace(0, 1, 256, dtype=np.float32)[:, None]).astype(np.int16)
    grain = _smooth_noise(rng, width, height, 3) * np.float32(60) + rng.standard_normal((height, width), dtype=np.float32) * np.float32(8)
    image = palette[(mix * 255).astype(np.uint8)]  # HxWx3 int16 by table look-up: cheaper than float maths
    image += grain.astype(np.int16)[..., None]
    return np.clip(image, 0, 255).astype(np.uint8)


def _smooth_noise(rng: np.random.Generator, width: int, height: int, cell: int) -> np.ndarray:
    """Uniform noise on a grid of ``cell`` px, bilinearly upsampled to HxW float32 in [0, 1]."""
    small = rng.random((height // cell + 2, width // cell + 2), dtype=np.float32)
    return np.asarray(Image.fromarray(small, "F").resize((width, height), Image.Resampling.BILINEAR), dtype=np.float32)


def _encode(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=JPEG_QUALITY, **options)
    return buffer.getvalue()


def _quirk_bytes(quirk: str, pixels: np.ndarray, rng: np.random.Generator) -> bytes:
    """The bytes of one quirk file; the picture (where there is one) is ``pixels`` as seen upright."""
    image = Image.fromarray(pixels)
    if quirk == "cmyk":
        return _encode(image.convert("CMYK"))
    if quirk == "grayscale":
        return _encode(image.convert("L"))
    if quirk == "grayscale_progressive":
        return _encode(image.convert("L"), progressive=True)
    if quirk == "png_named_jpeg":
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        return buffer.getvalue()
    if quirk == "exif_rotated":  # stored rotated; orientation 6 ("rotate 90 CW to view") brings it upright
        exif = Image.Exif()
        exif[0x0112] = 6
        return _encode(image.transpose(Image.Transpose.ROTATE_90), exif=exif.tobytes())
    if quirk == "truncated":
        data = _encode(image)
        return data[: len(data) // 2]
    if quirk == "empty":
        return b""
    if quirk == "not_an_image":
        return NOT_AN_IMAGE
    raise ValueError(f"unknown quirk {quirk!r}")


def _val_csv(val_jobs: list[_Job], wnids: list[str], seed: int) -> bytes:
    """Kaggle's LOC_val_solution.csv: one row per val image, a plausible box after the wnid."""
    rng = np.random.default_rng([seed, 13])
    lines = ["ImageId,PredictionString"]
    for job in val_jobs:
        x0, y0 = rng.integers(0, 100, size=2).tolist()
        x1, y1 = rng.integers(200, 300, size=2).tolist()
        lines.append(f"ILSVRC2012_val_{job.k:08d},{wnids[job.label]} {x0} {y0} {x1} {y1}")
    return ("\n".join(lines) + "\n").encode()
