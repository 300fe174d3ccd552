"""imgpipe.synth.tree and ``imgpipe synth``: determinism, photo-like sizes, class signal, quirks, val CSV."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from imgpipe.errors import DatasetError
from imgpipe.image.codec import prepare_image
from imgpipe.image.jpeg import inspect_jpeg
from imgpipe.ingest.scan import scan
from imgpipe.synth.tree import QUIRKS, make_synthetic

SMALL = dict(classes=3, per_class=4, val_per_class=2, seed=5, min_side=40, max_side=72, progress=False)


def digest_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.timeout(120)
def test_same_arguments_give_identical_bytes_whatever_the_workers(tmp_path: Path) -> None:
    first = make_synthetic(tmp_path / "a", quirks=True, **SMALL)
    second = make_synthetic(tmp_path / "b", quirks=True, workers=2, **SMALL)
    a, b = digest_tree(tmp_path / "a"), digest_tree(tmp_path / "b")
    assert a == b
    assert len(a) == 3 * 4 + len(QUIRKS) + 3 * 2 + 2  # images + quirks + val + CSV + marker
    assert first.classes == second.classes and first.bytes == second.bytes
    other = make_synthetic(tmp_path / "c", **{**SMALL, "seed": 6})
    assert other.classes != first.classes
    assert digest_tree(tmp_path / "c")["train/" + other.classes[0] + "/" + other.classes[0] + "_0.JPEG"] not in a.values()


def test_layout_and_val_csv(tmp_path: Path) -> None:
    summary = make_synthetic(tmp_path, **SMALL)
    assert all(w.startswith("n") and len(w) == 9 and w[1:].isdigit() for w in summary.classes)
    assert summary.classes == sorted(summary.classes)
    assert (summary.train_images, summary.val_images) == (12, 6)
    assert summary.bytes == sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith("."))
    lines = (tmp_path / "LOC_val_solution.csv").read_text().splitlines()
    assert lines[0] == "ImageId,PredictionString" and len(lines) == 7
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == [f"ILSVRC2012_val_{k:08d}.JPEG" for k in range(1, 7)]
    tree = scan(tmp_path)
    assert tree.layout == "imagenet" and tree.classes == summary.classes
    assert np.bincount(tree.splits["val"].labels, minlength=3).tolist() == [2, 2, 2]
    assert np.bincount(tree.splits["train"].labels).tolist() == [4, 4, 4]
    for line in lines[1:]:
        image_id, prediction = line.split(",")
        wnid, *box = prediction.split()
        assert wnid in summary.classes and len(box) == 4 and all(v.isdigit() for v in box)


@pytest.mark.timeout(120)
def test_default_sizes_look_like_imagenet(tmp_path: Path) -> None:
    make_synthetic(tmp_path, classes=3, per_class=20, val_per_class=0, seed=0, progress=False)
    files = sorted((tmp_path / "train").rglob("*.JPEG"))
    assert len(files) == 60
    sizes = np.array([p.stat().st_size for p in files])
    sides = []
    for path in files:
        data = path.read_bytes()
        info = inspect_jpeg(data)
        assert info.components == 3 and info.sof == 0xC0 and prepare_image(data).action == "kept"
        sides.append((info.width, info.height))
    sides = np.array(sides)
    assert 300 <= np.median(sides) <= 500
    assert np.mean((sides >= 300) & (sides <= 500)) > 0.9
    assert sides.max() >= 1000  # the tail of large images
    assert 60e3 <= sizes.mean() <= 160e3, sizes.mean()


def _mean_colour(path: Path, rng: np.random.Generator) -> np.ndarray:
    """Mean RGB of a random 24x24 crop, flipped at random: what a tiny CNN sees after augmentation."""
    with Image.open(path) as image:
        w, h = image.size
        x, y = rng.integers(0, w - 24), rng.integers(0, h - 24)
        crop = image.convert("RGB").crop((x, y, x + 24, y + 24))
    if rng.random() < 0.5:
        crop = ImageOps.mirror(crop)
    return np.asarray(crop, np.float32).reshape(-1, 3).mean(0)


def test_class_is_recognisable_from_small_crops(tmp_path: Path) -> None:
    make_synthetic(tmp_path, classes=6, per_class=8, val_per_class=0, seed=1, min_side=48, max_side=80, progress=False)
    rng = np.random.default_rng(0)
    classes = sorted(p.name for p in (tmp_path / "train").iterdir())
    colours = {c: [_mean_colour(p, rng) for p in sorted((tmp_path / "train" / c).iterdir())] for c in classes}
    centroids = np.array([np.mean(colours[c][:4], axis=0) for c in classes])
    held_out = [(label, x) for label, c in enumerate(classes) for x in colours[c][4:]]
    correct = sum(int(np.argmin(((centroids - x) ** 2).sum(1)) == label) for label, x in held_out)
    assert correct / len(held_out) >= 0.8


def test_quirk_files_are_present_and_handled_as_declared(tmp_path: Path) -> None:
    summary = make_synthetic(tmp_path, quirks=True, **SMALL)
    assert set(summary.quirk_files) == set(QUIRKS)
    assert summary.train_images == 12 + len(QUIRKS)
    for quirk, path in summary.quirk_files.items():
        assert path.startswith("train/") and path.endswith(".JPEG")
        data = (tmp_path / path).read_bytes()
        prepared = prepare_image(data)
        assert prepared.action == QUIRKS[quirk], (quirk, prepared.reason)
    assert (tmp_path / summary.quirk_files["empty"]).stat().st_size == 0
    assert Image.open(tmp_path / summary.quirk_files["png_named_jpeg"]).format == "PNG"
    assert Image.open(tmp_path / summary.quirk_files["cmyk"]).mode == "CMYK"
    assert Image.open(tmp_path / summary.quirk_files["grayscale"]).mode == "L"
    assert "truncated" in prepare_image((tmp_path / summary.quirk_files["truncated"]).read_bytes()).reason
    rotated = (tmp_path / summary.quirk_files["exif_rotated"]).read_bytes()
    assert inspect_jpeg(rotated).orientation == 6
    repaired = Image.open(io.BytesIO(prepare_image(rotated).data))
    stored = Image.open(io.BytesIO(rotated))
    assert repaired.size == stored.size[::-1]
    # Same class, same stripe orientation as its upright neighbours: the stored copy is turned 90 degrees.
    upright = np.asarray(repaired.convert("RGB"), np.float32)
    turned = np.asarray(stored.convert("RGB").transpose(Image.Transpose.ROTATE_270), np.float32)
    wrong_way = np.asarray(stored.convert("RGB").transpose(Image.Transpose.ROTATE_90), np.float32)
    assert np.abs(upright - turned).mean() < 8 < np.abs(upright - wrong_way).mean()


def test_rerun_is_a_no_op_and_conflicts_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "synth"
    first = make_synthetic(out, **SMALL)
    before = digest_tree(out)
    assert make_synthetic(out, **SMALL) == first
    assert digest_tree(out) == before
    with pytest.raises(DatasetError, match="other arguments"):
        make_synthetic(out, **{**SMALL, "seed": 9})
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="not empty"):
        make_synthetic(tmp_path / "busy", **SMALL)
    with pytest.raises(DatasetError, match="min_side"):
        make_synthetic(tmp_path / "bad", **{**SMALL, "min_side": 100, "max_side": 50})


@pytest.mark.timeout(120)
def test_cli(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    args = [sys.executable, "-m", "imgpipe", "synth", str(out), "--classes", "2", "--per-class", "2", "--val-per-class", "1",
            "--seed", "3", "--min-side", "32", "--max-side", "48", "--quirks"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "2 classes, 12 train + 2 val images, 8 quirk files" in done.stdout
    assert len(list((out / "train").rglob("*.JPEG"))) == 12
    conflict = subprocess.run(args[:-1], capture_output=True, text=True, timeout=100)
    assert conflict.returncode != 0
    assert conflict.stderr.startswith("imgpipe: error: ") and "Traceback" not in conflict.stderr


def test_output_under_a_file_and_zero_counts_are_handled(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DatasetError, match="cannot create the output folder"):
        make_synthetic(tmp_path / "afile" / "sub", classes=1, per_class=1, min_side=8, max_side=8, progress=False)
    summary = make_synthetic(tmp_path / "valonly", classes=2, per_class=0, val_per_class=2, min_side=8, max_side=8, progress=False)
    tree = scan(tmp_path / "valonly")
    assert tree.layout == "imagenet" and tree.classes == summary.classes
    assert len(tree.splits["train"]) == 0 and sorted(tree.splits["val"].labels.tolist()) == [0, 0, 1, 1]
    make_synthetic(tmp_path / "none", classes=2, per_class=0, val_per_class=0, min_side=8, max_side=8, progress=False)
    assert sorted(p.name for p in (tmp_path / "none" / "train").iterdir()) == summary.classes


@pytest.mark.timeout(120)
def test_a_layout_from_an_existing_tree_is_the_layout_synth_makes(tmp_path: Path) -> None:
    """``--from TREE`` writes TREE (made with the same arguments) in the layout: the same bytes, and TREE is kept."""
    tree = make_synthetic(tmp_path / "tree", quirks=True, **SMALL)
    before = digest_tree(tmp_path / "tree")
    made = make_synthetic(tmp_path / "made", quirks=True, layout="wds", **SMALL)
    taken = make_synthetic(tmp_path / "taken", quirks=True, layout="wds", source=tmp_path / "tree", **SMALL)
    assert digest_tree(tmp_path / "taken") == digest_tree(tmp_path / "made")
    assert (taken.classes, taken.bytes) == (made.classes, made.bytes) == (tree.classes, made.bytes)
    assert digest_tree(tmp_path / "tree") == before
    make_synthetic(tmp_path / "made-tars", quirks=True, tars=True, **SMALL)
    make_synthetic(tmp_path / "taken-tars", quirks=True, tars=True, source=tmp_path / "tree", **SMALL)
    assert digest_tree(tmp_path / "taken-tars") == digest_tree(tmp_path / "made-tars")
    args = [sys.executable, "-m", "imgpipe", "synth", str(tmp_path / "other"), "--from", str(tmp_path / "tree"),
            "--layout", "wds", "--classes", "3", "--per-class", "4", "--val-per-class", "2", "--seed", "5",
            "--min-side", "40", "--max-side", "72"]  # fmt: skip
    no_quirks = subprocess.run(args, capture_output=True, text=True, timeout=100)  # the tree has them
    assert no_quirks.returncode != 0 and no_quirks.stderr.count("\n") == 1 and "with other arguments" in no_quirks.stderr
    with pytest.raises(DatasetError, match="another --layout"):
        make_synthetic(tmp_path / "tree2", quirks=True, source=tmp_path / "tree", **SMALL)
    with pytest.raises(DatasetError, match="other arguments"):  # a layout is not a tree
        make_synthetic(tmp_path / "none", quirks=True, layout="wds", source=tmp_path / "made", **SMALL)
    with pytest.raises(DatasetError, match="not a tree imgpipe synth wrote"):
        make_synthetic(tmp_path / "none", quirks=True, layout="wds", source=tmp_path / "nowhere", **SMALL)
