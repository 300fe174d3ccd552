"""A folder name that belongs to a known layout is never a class: a layout with a split missing packs the split it has,
or is one line saying what is missing (before, ``val/`` alone or ``imagenet21k_val/`` alone was packed as one class
named after the folder, every image with one label)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

from imgpipe.errors import DatasetError
from imgpipe.format.manifest import load_manifest
from imgpipe.ingest.scan import scan
from imgpipe.packing.packer import pack
from imgpipe.synth.tree import make_synthetic

SYNTH = dict(classes=3, per_class=3, val_per_class=2, seed=9, min_side=32, max_side=64, progress=False)
OPTIONS = dict(shards=2, workers=1, progress=False)
COMPARED = (".rec", ".idx", ".npy")


def shard_files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name.endswith(COMPARED)}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``flat/``: train/ and a flat val/ with its CSV; ``sorted/``: the same with val/ in class folders."""
    base = tmp_path_factory.mktemp("layout-folders")
    make_synthetic(base / "flat", **SYNTH)  # type: ignore[arg-type]
    shutil.copytree(base / "flat" / "train", base / "sorted" / "train")
    rows = (base / "flat" / "LOC_val_solution.csv").read_text().splitlines()[1:]
    for image_id, wnid in (row.split(",")[0:2] for row in rows):
        (base / "sorted" / "val" / wnid.split()[0]).mkdir(parents=True, exist_ok=True)
        shutil.copy(base / "flat" / "val" / f"{image_id}.JPEG", base / "sorted" / "val" / wnid.split()[0])
    return base


def lone_flat_val(trees: Path, src: Path) -> Path:
    shutil.copytree(trees / "flat" / "val", src / "val")
    shutil.copy(trees / "flat" / "LOC_val_solution.csv", src)
    return trees / "flat"


def lone_sorted_val(trees: Path, src: Path) -> Path:
    shutil.copytree(trees / "sorted" / "val", src / "val")
    return trees / "sorted"


def lone_imagenet21k_p_val(trees: Path, src: Path) -> Path:
    shutil.copytree(trees / "sorted" / "val", src / "imagenet21k_val")
    shutil.copytree(trees / "sorted" / "train", src / "imagenet21k_small_classes")  # never read
    return trees / "sorted"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "build, layout",
    [(lone_flat_val, "imagenet"), (lone_sorted_val, "imagenet"), (lone_imagenet21k_p_val, "imagenet21k-p")],
    ids=["val-flat-with-csv", "val-class-folders", "imagenet21k_val"],
)
def test_a_lone_val_folder_packs_as_the_val_split_of_its_layout(
    build: Callable[[Path, Path], Path], layout: str, trees: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    whole = build(trees, src)
    report = pack(src, tmp_path / "out", **OPTIONS)  # type: ignore[arg-type]
    reference = pack(whole, tmp_path / "ref", splits=["val"], **OPTIONS)  # type: ignore[arg-type]
    manifest = load_manifest(tmp_path / "out")
    assert manifest.layout == layout and list(manifest.splits) == ["val"]
    assert manifest.classes == load_manifest(tmp_path / "ref").classes == sorted(os.listdir(trees / "sorted" / "val"))
    assert report.records == reference.records == {"val": SYNTH["classes"] * SYNTH["val_per_class"]}
    assert shard_files(tmp_path / "out") == shard_files(tmp_path / "ref")  # the same labels: one per class, not one for all
    assert "imagenet21k_small_classes" not in (tmp_path / "out" / "val.sources.txt").read_text()


@pytest.mark.timeout(120)
def test_the_kaggle_download_packs_alike_from_its_root_from_ilsvrc_and_from_ilsvrc_data(trees: Path, tmp_path: Path) -> None:
    root = tmp_path / "kaggle"
    data = root / "ILSVRC" / "Data" / "CLS-LOC"
    shutil.copytree(trees / "flat" / "train", data / "train")
    shutil.copytree(trees / "flat" / "val", data / "val")
    (root / "ILSVRC" / "Annotations").mkdir()
    shutil.copy(trees / "flat" / "LOC_val_solution.csv", root)  # beside ILSVRC/, as Kaggle ships it
    packed = []
    for k, src in enumerate((root, root / "ILSVRC", root / "ILSVRC" / "Data")):
        pack(src, tmp_path / f"out{k}", **OPTIONS)  # type: ignore[arg-type]
        assert load_manifest(tmp_path / f"out{k}").layout == "kaggle"
        packed.append(shard_files(tmp_path / f"out{k}"))
    assert packed[0] == packed[1] == packed[2]
    assert (tmp_path / "out1" / "train.sources.txt").read_text().startswith("Data/CLS-LOC/train/n")


def only(*folders: str) -> Callable[[Path], None]:
    def build(src: Path) -> None:
        for folder in folders:
            (src / folder).mkdir(parents=True)

    return build


@pytest.mark.parametrize(
    "build, message",
    [
        (only("imagenet21k_small_classes/n01440764"), "imagenet21k_small_classes: the classes ImageNet-21K-P leaves out, never "
         "packed; imagenet21k_train/ and imagenet21k_val/ are missing beside it: extract them there"),
        (only("imagenet21k_resized/imagenet21k_train/n01440764"), "imagenet21k_resized: not a class folder: the folder "
         "ImageNet-21K-P's download unpacks to; give it as SRC"),
        (only("ILSVRC/Annotations/CLS-LOC"), "ILSVRC: not a class folder: the Kaggle download without Data/CLS-LOC/ inside"),
        (only("ILSVRC/Data/CLS-LOC/test"), "ILSVRC/Data/CLS-LOC: no train/ or val/ inside; extract them there from the Kaggle download"),
        (only("Annotations/CLS-LOC", "ImageSets/CLS-LOC"), "Annotations: not a class folder: part of the Kaggle download; give the "
         "folder that holds ILSVRC/ as SRC"),
        (only("test"), "test: not a class folder: ImageNet's test images, which carry no labels"),
        (only("val/n01440764", "cat", "dog"), "val/ beside cat/ but no train folder; to pack class folders, move them into a train/"),
        (only("imagenet21k_val/n01440764", "n01443537"), "imagenet21k_val/ beside n01443537/ but no train folder"),
        (lambda src: (src / "val").mkdir() or (src / "val" / "ILSVRC2012_val_00000001.JPEG").write_bytes(b"x"),
         "val: flat val folder but no LOC_val_solution.csv beside it or at"),
    ],
    ids=["imagenet21k_small_classes", "imagenet21k_resized", "ILSVRC-without-Data", "CLS-LOC-with-test-only", "ILSVRC-given-as-SRC",
         "test", "val-beside-class-folders", "imagenet21k_val-beside-a-class-folder", "flat-val-without-csv"],
)  # fmt: skip
def test_a_layout_missing_its_split_folders_is_one_line_saying_what_is_missing(
    build: Callable[[Path], None], message: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    build(src)
    with pytest.raises(DatasetError) as error:
        scan(src)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert "--splits train" not in str(error.value)  # there is no train/ to pack instead


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "split, nested",
    [("train", "train"), ("val", "val"), ("train", "val"), ("val", "train"), ("imagenet21k_train", "imagenet21k_train"),
     ("train", "imagenet21k_val"), ("train", "ILSVRC")],
)  # fmt: skip
def test_a_layouts_folder_inside_a_split_folder_is_one_line_never_a_class(split: str, nested: str, trees: Path, tmp_path: Path) -> None:
    """``train/train/<wnid>/`` (a download extracted one level too deep) was packed as one class named "train", exit 0."""
    src = tmp_path / "src"
    shutil.copytree(trees / "sorted" / "train", src / split / nested)
    if split == "val" and nested == "train":
        shutil.copytree(trees / "sorted" / "train", src / "train")  # beside it, the train split the val classes come from
    with pytest.raises(DatasetError) as error:
        pack(src, tmp_path / "out", **OPTIONS)  # type: ignore[arg-type]
    assert str(error.value).startswith(f"{src / split / nested}: not a class folder: a download's {nested}/ folder inside {split}/")
    assert f"give {src / split} as SRC" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out" / "manifest.json").exists()
