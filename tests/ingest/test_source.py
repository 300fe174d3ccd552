"""imgpipe.ingest.folders: the three accepted layouts, class order, val labels, filtering and errors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from torchvision.datasets import ImageFolder

from imgpipe.errors import DatasetError
from imgpipe.ingest.scan import scan

WNIDS = ["n02000000", "n01000000", "n03000000"]  # unsorted on purpose


def touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def make_train(train: Path, per_class: int = 2) -> None:
    for wnid in WNIDS:
        for k in range(per_class):
            touch(train / wnid / f"{wnid}_{k}.JPEG")


def write_csv(path: Path, rows: list[tuple[str, str]], header: str = "ImageId,PredictionString") -> None:
    lines = [header] + [f"{image_id},{wnid} 1 2 30 40 {wnid} 5 6 7 8" for image_id, wnid in rows]
    path.write_text("\n".join(lines) + "\n")


VAL_ROWS = [("ILSVRC2012_val_00000003", "n03000000"), ("ILSVRC2012_val_00000001", "n02000000"), ("ILSVRC2012_val_00000002", "n01000000")]


def make_flat_val(val: Path, csv: Path, rows: list[tuple[str, str]] = VAL_ROWS) -> None:
    for image_id, _ in rows:
        touch(val / f"{image_id}.JPEG")
    write_csv(csv, rows)


def test_imagenet_root_with_flat_val_and_csv(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    make_flat_val(tmp_path / "val", tmp_path / "LOC_val_solution.csv")
    tree = scan(tmp_path)
    assert tree.layout == "imagenet" and tree.root == tmp_path
    assert tree.classes == sorted(WNIDS)
    train = tree.splits["train"]
    assert train.paths == [f"train/{w}/{w}_{k}.JPEG" for w in sorted(WNIDS) for k in range(2)]
    assert train.labels.dtype == np.int32 and train.labels.tolist() == [0, 0, 1, 1, 2, 2]
    val = tree.splits["val"]
    assert val.paths == [f"val/ILSVRC2012_val_0000000{k}.JPEG" for k in (1, 2, 3)]
    assert val.labels.dtype == np.int32
    assert [tree.classes[i] for i in val.labels] == ["n02000000", "n01000000", "n03000000"]
    assert list(tree.splits) == ["train", "val"]


def test_imagenet_root_with_class_folder_val(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    touch(tmp_path / "val" / "n03000000" / "a.jpg")
    touch(tmp_path / "val" / "n01000000" / "b.png")
    tree = scan(tmp_path)
    assert tree.splits["val"].paths == ["val/n01000000/b.png", "val/n03000000/a.jpg"]
    assert tree.splits["val"].labels.tolist() == [0, 2]


def test_kaggle_layout(tmp_path: Path) -> None:
    data = tmp_path / "ILSVRC" / "Data" / "CLS-LOC"
    make_train(data / "train", per_class=1)
    make_flat_val(data / "val", tmp_path / "LOC_val_solution.csv")
    touch(data / "test" / "ILSVRC2012_test_00000001.JPEG")
    tree = scan(tmp_path)
    assert tree.layout == "kaggle" and set(tree.splits) == {"train", "val"}
    assert tree.splits["train"].paths[0] == "ILSVRC/Data/CLS-LOC/train/n01000000/n01000000_0.JPEG"
    assert tree.splits["val"].paths[0] == "ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_00000001.JPEG"
    assert tree.splits["val"].labels.tolist() == [1, 0, 2]
    assert all((tmp_path / p).is_file() for p in tree.splits["train"].paths + tree.splits["val"].paths)


def test_kaggle_data_folder_given_directly_finds_the_csv_above(tmp_path: Path) -> None:
    data = tmp_path / "ILSVRC" / "Data" / "CLS-LOC"
    make_train(data / "train", per_class=1)
    make_flat_val(data / "val", tmp_path / "LOC_val_solution.csv")
    tree = scan(data)
    assert tree.layout == "imagenet" and tree.splits["val"].paths[0] == "val/ILSVRC2012_val_00000001.JPEG"
    assert tree.splits["val"].labels.tolist() == [1, 0, 2]


def test_class_folder_tree_matches_torchvision_image_folder(tmp_path: Path) -> None:
    root = tmp_path / "pets"
    for name in ["cat/b.jpg", "cat/a.PNG", "cat/z/inner.jpeg", "cat/y.JPG", "Dog/1.bmp", "dog/x.webp", "bird/deep/er/e.tif"]:
        touch(root / name)
    touch(root / "cat" / "notes.txt")
    reference = ImageFolder(str(root), loader=lambda path: path)
    touch(root / ".hidden" / "h.jpg")  # hidden files and folders: ImageFolder takes them, imgpipe ignores them
    touch(root / "cat" / "._a.jpg")
    tree = scan(root)
    assert tree.layout == "class-folders" and list(tree.splits) == ["train"]
    assert tree.classes == reference.classes == ["Dog", "bird", "cat", "dog"]
    got = [(str(root / p), int(label)) for p, label in zip(tree.splits["train"].paths, tree.splits["train"].labels)]
    assert got == [(os.path.normpath(p), label) for p, label in reference.samples]


def test_more_image_extensions_than_torchvision_and_any_case(tmp_path: Path) -> None:
    for name in ["a.GIF", "b.jpe", "c.JFIF", "d.Jpeg", "e.pgm", "f.xml", "g", "h.jpeg.bak"]:
        touch(tmp_path / "c" / name)
    assert scan(tmp_path).splits["train"].paths == ["c/a.GIF", "c/b.jpe", "c/c.JFIF", "c/d.Jpeg", "c/e.pgm"]


def test_empty_class_keeps_its_label(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    touch(tmp_path / "a" / "1.jpg")
    (tmp_path / "b").mkdir()
    touch(tmp_path / "c" / "2.jpg")
    tree = scan(tmp_path)
    assert tree.classes == ["a", "b", "c"] and tree.splits["train"].labels.tolist() == [0, 2]
    assert "no images" in caplog.text


def test_split_filter(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    touch(tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG")  # flat val without its CSV
    assert list(scan(tmp_path, splits=["train"]).splits) == ["train"]
    with pytest.raises(DatasetError, match="LOC_val_solution.csv"):
        scan(tmp_path)
    with pytest.raises(DatasetError, match=r"split 'test' not found .*train, val"):
        scan(tmp_path, splits=["train", "test"])


def test_val_csv_next_to_val_in_a_nested_root(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    make_flat_val(tmp_path / "val", tmp_path / "val" / "LOC_val_solution.csv")
    assert scan(tmp_path).splits["val"].labels.tolist() == [1, 0, 2]


def test_val_wnid_not_in_train_names_the_csv_line(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    rows = VAL_ROWS[:2] + [("ILSVRC2012_val_00000009", "n09999999")]
    make_flat_val(tmp_path / "val", tmp_path / "LOC_val_solution.csv", rows)
    with pytest.raises(DatasetError, match=r"LOC_val_solution.csv: line 4: class 'n09999999' of ILSVRC2012_val_00000009"):
        scan(tmp_path)


def test_val_image_without_a_csv_row(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    make_flat_val(tmp_path / "val", tmp_path / "LOC_val_solution.csv")
    touch(tmp_path / "val" / "extra.JPEG")
    with pytest.raises(DatasetError, match=r"val/extra.JPEG: no row for 'extra'"):
        scan(tmp_path)


def test_bad_csv_header_and_rows(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    make_flat_val(tmp_path / "val", tmp_path / "LOC_val_solution.csv")
    write_csv(tmp_path / "LOC_val_solution.csv", VAL_ROWS, header="id,label")
    with pytest.raises(DatasetError, match="line 1 must be the header"):
        scan(tmp_path)
    (tmp_path / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,\n")
    with pytest.raises(DatasetError, match="line 2: expected"):
        scan(tmp_path)


def test_val_class_not_in_train(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    touch(tmp_path / "val" / "n07777777" / "x.JPEG")
    with pytest.raises(DatasetError, match="n07777777.*not a train class"):
        scan(tmp_path)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda root: touch(root / "a.jpg"), "accepted layouts"),
        (lambda root: touch(root / "train" / "a.jpg"), "no class folders inside"),
        (lambda root: None, "accepted layouts"),
    ],
    ids=["flat-images", "flat-train", "empty"],
)
def test_unknown_layouts_are_explained(tmp_path: Path, build, message: str) -> None:
    build(tmp_path)
    with pytest.raises(DatasetError, match=message):
        scan(tmp_path)


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="source folder not found"):
        scan(tmp_path / "nope")


@pytest.mark.timeout(30)
def test_symlink_loop_terminates(tmp_path: Path) -> None:
    touch(tmp_path / "a" / "1.jpg")
    os.symlink(tmp_path / "a", tmp_path / "a" / "loop")
    paths = scan(tmp_path).splits["train"].paths
    assert paths[0] == "a/1.jpg" and len(paths) < 10


def test_a_newline_in_a_file_name_is_rejected_with_a_reason(tmp_path: Path) -> None:
    touch(tmp_path / "train" / "n01" / "good.JPEG")
    touch(tmp_path / "train" / "n01" / "bad\nname.JPEG")
    touch(tmp_path / "train" / "n02" / "tab\tand space ü.JPEG")
    touch(tmp_path / "val" / "n01" / "v\nx.JPEG")
    touch(tmp_path / "val" / "n02" / "v.JPEG")
    tree = scan(tmp_path)
    assert tree.splits["train"].paths == ["train/n01/good.JPEG", "train/n02/tab\tand space ü.JPEG"]
    assert tree.splits["train"].labels.tolist() == [0, 1]
    assert [path for path, _ in tree.splits["train"].rejected] == ["train/n01/bad\nname.JPEG"]
    assert "newline" in tree.splits["train"].rejected[0][1]
    assert tree.splits["val"].paths == ["val/n02/v.JPEG"]
    assert [path for path, _ in tree.splits["val"].rejected] == ["val/n01/v\nx.JPEG"]


def test_an_empty_flat_val_folder_needs_no_label_file(tmp_path: Path) -> None:
    touch(tmp_path / "train" / "n01" / "a.JPEG")
    (tmp_path / "val").mkdir()
    tree = scan(tmp_path)
    assert tree.splits["train"].paths == ["train/n01/a.JPEG"] and len(tree.splits["val"]) == 0


@pytest.mark.timeout(30)
def test_folder_links_never_pack_an_image_twice(tmp_path: Path) -> None:
    src, outside = tmp_path / "src", tmp_path / "outside"
    for path in ("A/1.jpg", "B/2.jpg", "B/sub/3.jpg"):
        touch(src / path)
    touch(outside / "E" / "4.jpg")
    os.symlink("..", src / "A" / "up")  # back up the tree: every class again under A/up
    os.symlink("../B/sub", src / "A" / "cross")  # into another class: B/sub keeps its own label
    os.symlink(outside / "E", src / "A" / "ext")  # outside the tree: followed once
    os.symlink(src, outside / "E" / "back")  # ... and from there back in
    items = scan(src).splits["train"]
    assert items.paths == ["A/1.jpg", "A/ext/4.jpg", "B/2.jpg", "B/sub/3.jpg"]
    assert items.labels.tolist() == [0, 0, 1, 1]


def test_a_file_link_loop_is_listed_and_skipped_with_a_reason_at_pack_time(tmp_path: Path) -> None:
    from PIL import Image

    from imgpipe.packing.packer import pack

    src = tmp_path / "src"
    (src / "A").mkdir(parents=True)
    Image.new("RGB", (16, 16)).save(src / "A" / "ok.jpg")
    os.symlink("loop.jpg", src / "A" / "loop.jpg")
    os.symlink("self", src / "A" / "self")  # no image extension: ignored
    assert scan(src).splits["train"].paths == ["A/loop.jpg", "A/ok.jpg"]
    report = pack(src, tmp_path / "dst", workers=1, progress=False)
    assert [(s.path, s.reason) for s in report.skipped] == [("A/loop.jpg", "unreadable (Too many levels of symbolic links)")]
    assert report.records == {"train": 1}


def strict_json(raw: bytes) -> object:
    """Parse as a strict reader does: UTF-8 text without lone surrogates."""
    import json

    data = json.loads(raw.decode("utf-8"))
    json.dumps(data, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate such as "\udce9"
    return data


def test_non_utf8_names_are_skipped_with_a_reason_and_the_manifest_stays_strict_json(tmp_path: Path) -> None:
    from PIL import Image

    from imgpipe.packing.packer import pack

    src = tmp_path / "src"
    (src / "A").mkdir(parents=True)
    Image.new("RGB", (16, 16)).save(src / "A" / "ok.jpg")
    Image.new("RGB", (16, 16)).save(os.fsdecode(os.fsencode(src / "A") + b"/caf\xe9.jpg"))
    report = pack(src, tmp_path / "dst", workers=1, progress=False)
    assert [(s.path, s.reason) for s in report.skipped] == [
        ("A/caf\\xe9.jpg", "file or folder name is not valid UTF-8 (the manifest and the sidecars are UTF-8); rename it")
    ]
    manifest = strict_json((tmp_path / "dst" / "manifest.json").read_bytes())
    assert manifest["skipped"][0]["path"] == "A/caf\\xe9.jpg"

    os.mkdir(os.fsencode(src) + b"/B\xff")
    with pytest.raises(DatasetError, match=r"src/B\\xff: file or folder name is not valid UTF-8"):
        scan(src)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_val_csv_with_a_byte_order_mark_is_read(tmp_path: Path, encoding: str) -> None:
    make_train(tmp_path / "train")
    make_flat_val(tmp_path / "val", tmp_path / "LOC_val_solution.csv")
    csv = tmp_path / "LOC_val_solution.csv"
    csv.write_bytes(csv.read_text().replace("\n", "\r\n").encode(encoding))  # as Excel saves it
    val = scan(tmp_path).splits["val"]
    assert val.labels.tolist() == [1, 0, 2]


def test_a_val_csv_that_is_not_utf8_is_one_line_naming_it(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    make_flat_val(tmp_path / "val", tmp_path / "LOC_val_solution.csv")
    csv = tmp_path / "LOC_val_solution.csv"
    csv.write_bytes(csv.read_bytes().replace(b"n01000000 1", b"n01000000 \xe9"))  # Latin-1
    with pytest.raises(DatasetError, match=r"LOC_val_solution.csv: not UTF-8 text \(byte 0xe9 at offset \d+\); save it as CSV UTF-8"):
        scan(tmp_path)


def test_two_class_folders_that_are_one_folder_are_refused(tmp_path: Path) -> None:
    touch(tmp_path / "A" / "1.jpg")
    os.symlink("A", tmp_path / "B")
    with pytest.raises(DatasetError, match=r"/B: the same folder as class 'A' \(a link\?\), so its images would be packed twice"):
        scan(tmp_path)


def test_val_csv_rows_that_conflict_or_are_not_csv_are_one_line(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    make_flat_val(tmp_path / "val", tmp_path / "LOC_val_solution.csv")
    csv = tmp_path / "LOC_val_solution.csv"
    good = csv.read_text()
    csv.write_text(good + "ILSVRC2012_val_00000001,n03000000 1 2 3 4\n")
    with pytest.raises(DatasetError, match=r"line 5: ILSVRC2012_val_00000001 is n03000000, but line 3 says n02000000; keep one row"):
        scan(tmp_path)
    csv.write_text(good + "ILSVRC2012_val_00000001,n02000000 9 9 9 9\n")  # the same label twice: fine
    assert len(scan(tmp_path).splits["val"]) == 3
    csv.write_text(good + 'ILSVRC2012_val_00000009,"' + "x" * 200_000 + '"\n')  # over the csv module's field limit
    with pytest.raises(DatasetError, match=r"LOC_val_solution.csv: line \d: not readable as CSV \(field larger than field limit"):
        scan(tmp_path)


def test_a_class_folder_with_a_newline_is_one_line_naming_it(tmp_path: Path) -> None:
    make_train(tmp_path / "train")
    (tmp_path / "train" / "n01\nx").mkdir()
    with pytest.raises(DatasetError) as caught:
        scan(tmp_path)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(repr(str(tmp_path / "train" / "n01\nx")) + ": ")
