"""The publishers' own loaders decide what a download holds: Hugging Face's ``iter_archive`` and loading script for
its tarballs, webdataset's ``tar_file_iterator`` and timm's ``reader_wds`` (with its ``_info.json``) for the shards.

Each rule is checked on real archives against the pack of the tree those loaders would see.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from _cli import assert_one_line_error

from imgpipe.packing.packer import pack
from imgpipe.synth.tree import make_synthetic

SYNTH = dict(classes=3, per_class=3, val_per_class=1, seed=3, min_side=24, max_side=40, progress=False)
COMPARED = (".rec", ".idx", ".labels.npy", ".crc32.npy", ".index.npy")


def shard_files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name.endswith(COMPARED)}


def imgpipe(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "imgpipe", *map(str, args)], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def tar_bytes(members: list[tarfile.TarInfo | tuple[str, bytes]], gz: bool = False) -> bytes:
    """A tar of ``members``: (name, data) files, or TarInfo headers with no data (links)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                archive.addfile(info, io.BytesIO(member[1]))
    return gzip.compress(buffer.getvalue(), mtime=0) if gz else buffer.getvalue()


def link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def jpegs(tree: Path) -> list[tuple[str, Path]]:
    """(wnid, path) of every train image of a synthetic tree, in tree order."""
    return [(folder.name, path) for folder in sorted((tree / "train").iterdir()) for path in sorted(folder.iterdir())]


# ----------------------------------------------------------------------------- Hugging Face's tarballs


def test_hf_tar_reads_the_members_iter_archive_yields(tmp_path: Path) -> None:
    """``iter_archive`` yields regular members whose base name starts with neither '.' nor '__': links and such names
    are not images of the dataset. A member in a hidden folder is (its base name is not hidden), and is the tree's file."""
    make_synthetic(tmp_path / "tree", **SYNTH)  # type: ignore[arg-type]
    make_synthetic(tmp_path / "hf", layout="hf-tar", **SYNTH)  # type: ignore[arg-type]
    archive = tmp_path / "hf" / "data" / "train_images_0.tar.gz"
    with tarfile.open(archive) as tar:
        members: list[tarfile.TarInfo | tuple[str, bytes]] = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    target = members[0][0]  # type: ignore[index]
    wnid = target[-len("n00000000.JPEG") : -len(".JPEG")]
    second = jpegs(tmp_path / "tree")[1][1]
    members += [
        (f".hidden_{wnid}.JPEG", second.read_bytes()),
        (f"__macosx_{wnid}.JPEG", second.read_bytes()),
        (f"sub/.dotted_{wnid}.JPEG", second.read_bytes()),
        (f"cache/.git/extra_{wnid}.JPEG", second.read_bytes()),  # read: its base name is not hidden
        link(f"hard_{wnid}.JPEG", target, tarfile.LNKTYPE),
        link(f"soft_{wnid}.JPEG", target, tarfile.SYMTYPE),
    ]
    archive.write_bytes(tar_bytes(members, gz=True))
    shutil.copy(second, tmp_path / "tree" / "train" / wnid / "extra.JPEG")
    (tmp_path / "tree" / "train" / wnid / ".hidden.JPEG").write_bytes(second.read_bytes())  # the tree scan skips it alike
    tree = pack(tmp_path / "tree", tmp_path / "from-tree", shards="train=2,val=1", workers=1, progress=False)
    hf = pack(tmp_path / "hf", tmp_path / "from-hf", shards="train=2,val=1", workers=1, progress=False)
    assert shard_files(tmp_path / "from-hf") == shard_files(tmp_path / "from-tree")
    assert hf.records == tree.records == {"train": 10, "val": 3}
    sources = (tmp_path / "from-hf" / "train.sources.txt").read_text().splitlines()
    assert f"data/train_images_0.tar.gz/cache/.git/extra_{wnid}.JPEG" in sources
    assert not [s for s in sources if "hidden" in s or "macosx" in s or "dotted" in s or "hard_" in s or "soft_" in s]


# ----------------------------------------------------------------------------- webdataset and timm


def class_tree(root: Path, images: dict[str, list[tuple[str, bytes]]]) -> None:
    """``root/train/<class>/<name>`` for each class's (name, bytes)."""
    for label, files in images.items():
        (root / "train" / label).mkdir(parents=True)
        for name, data in files:
            (root / "train" / label / name).write_bytes(data)


@pytest.fixture
def photos(tmp_path: Path) -> list[bytes]:
    make_synthetic(tmp_path / "synth", **SYNTH)  # type: ignore[arg-type]
    return [path.read_bytes() for _, path in jpegs(tmp_path / "synth")]


def test_wds_groups_and_names_samples_as_webdataset_and_timm(photos: list[bytes], tmp_path: Path) -> None:
    """webdataset skips ``__*__`` members and folders (``skip_meta``); a sample without a ``.json`` filename is named
    ``<key>.JPEG``, as timm's ``reader_wds`` names it (``key_ext``), its key keeping the folders of its members."""
    src = tmp_path / "wds"
    src.mkdir()
    shard = [
        ("__meta__/stray.jpg", photos[8]), ("__meta__/stray.cls", b"1"), ("__index__", b"x"),
        ("a.jpg", photos[0]), ("a.cls", b"0"), ("a.json", json.dumps({"filename": "first.JPEG"}).encode()),
        ("b.jpg", photos[1]), ("b.cls", b"0"),
        ("sub/c.jpg", photos[2]), ("sub/c.cls", b"1"), ("sub/c.json", b"{}"),
    ]  # fmt: skip
    (src / "mine-train-0000.tar").write_bytes(tar_bytes(shard))  # type: ignore[arg-type]
    class_tree(tmp_path / "tree", {"0": [("first.JPEG", photos[0]), ("b.JPEG", photos[1])], "1": []})
    (tmp_path / "tree" / "train" / "1" / "sub").mkdir()
    (tmp_path / "tree" / "train" / "1" / "sub" / "c.JPEG").write_bytes(photos[2])
    pack(tmp_path / "tree", tmp_path / "from-tree", workers=1, progress=False)
    report = pack(src, tmp_path / "from-wds", workers=1, progress=False)
    assert shard_files(tmp_path / "from-wds") == shard_files(tmp_path / "from-tree")
    assert report.records == {"train": 3}
    sources = sorted((tmp_path / "from-wds" / "train.sources.txt").read_text().splitlines())
    assert sources == ["mine-train-0000.tar/b.JPEG", "mine-train-0000.tar/first.JPEG", "mine-train-0000.tar/sub/c.JPEG"]


def wds_folder(root: Path, photos: list[bytes], info: dict | None) -> Path:
    """Three train shards of two samples each (labels 0, 1; ``.json`` with ``label12k``) and timm's ``_info.json``."""
    root.mkdir()
    for k in range(3):
        samples = []
        for j in range(2):
            key = f"s{k}{j}"
            meta = {"filename": f"{key}.JPEG", "label12k": [5, -1][j] if k == 2 else j}
            samples += [(f"{key}.jpg", photos[2 * k + j]), (f"{key}.cls", str(j).encode()), (f"{key}.json", json.dumps(meta).encode())]
        (root / f"in1k-train-{k:04d}.tar").write_bytes(tar_bytes(samples))  # type: ignore[arg-type]
    if info is not None:
        (root / "_info.json").write_text(json.dumps(info))
    return root


def test_timms_info_json_lists_each_splits_shards_and_its_label(
    photos: list[bytes], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As timm's ``reader_wds``: a split is the ``filenames`` its ``_info.json`` lists (a shard beside them is not read,
    one listed but absent is one line), ``shard_lengths`` are checked (a warning), and an ``alt_label`` labels it from
    the ``.json`` (-1 leaves a sample out)."""
    listed = ["in1k-train-0000.tar", "in1k-train-0001.tar"]
    info = {"name": "in1k", "splits": {"train": {"name": "train", "filenames": listed, "shard_lengths": [2, 3], "num_samples": 5}}}
    src = wds_folder(tmp_path / "wds", photos, info)
    with caplog.at_level(logging.WARNING):
        report = pack(src, tmp_path / "out", workers=1, progress=False)
    assert report.records == {"train": 4}  # in1k-train-0002.tar is not in the split
    assert f"{src / 'in1k-train-0001.tar'}: 2 samples, but {src / '_info.json'} says 3" in caplog.text

    info["splits"]["train"].update(filenames=["in1k-train-0002.tar"], shard_lengths=[2], alt_label="label12k")  # type: ignore[index]
    (src / "_info.json").write_text(json.dumps(info))
    report = pack(src, tmp_path / "alt", workers=1, progress=False)
    assert report.records == {"train": 1}
    assert (tmp_path / "alt" / "train.sources.txt").read_text() == "in1k-train-0002.tar/s20.JPEG\n"
    assert json.loads((tmp_path / "alt" / "manifest.json").read_text())["classes"] == ["5"]

    info["splits"]["train"].update(filenames=["in1k-train-0000.tar", "in1k-train-0009.tar"], shard_lengths=[2, 2])  # type: ignore[index]
    (src / "_info.json").write_text(json.dumps(info))
    assert_one_line_error(imgpipe("pack", src, tmp_path / "missing"), "_info.json", "'train' lists in1k-train-0009.tar", "download it")


def wds_sample(key: str, photo: bytes, label: int, filename: str) -> list[tuple[str, bytes]]:
    meta = json.dumps({"filename": filename, "label": label}).encode()
    return [(f"{key}.jpg", photo), (f"{key}.cls", str(label).encode()), (f"{key}.json", meta)]


def test_wds_classes_are_the_wnids_the_train_samples_name(photos: list[bytes], tmp_path: Path) -> None:
    """Shards of a subset of ImageNet's classes (labels 0, 5, 17 of the 1,000): every train sample's ``.json``
    ``filename`` names its wnid (``n01440764_149.JPEG``), so the classes are those wnids, and the shards are those of
    the tree the samples make; val samples (``ILSVRC2012_val_*.JPEG``, no wnid) take their label's wnid from train.
    Val packed alone, or wnids out of the labels' order, are named by label, as before."""
    from imgpipe.format.manifest import load_manifest
    from imgpipe.ingest.classnames import ilsvrc2012_wnids

    wnids = {label: ilsvrc2012_wnids()[label] for label in (0, 5, 17)}
    src = tmp_path / "wds"
    src.mkdir()
    train = [(f"{wnids[label]}_{k}.JPEG", photos[3 * j + k], label) for j, label in enumerate(wnids) for k in range(3)]
    members = [m for k, (name, photo, label) in enumerate(train) for m in wds_sample(f"s{k:02d}", photo, label, name)]
    (src / "in1k-train-0000.tar").write_bytes(tar_bytes(members))  # type: ignore[arg-type]
    val = [m for k, label in enumerate((5, 17)) for m in wds_sample(f"v{k}", photos[k], label, f"ILSVRC2012_val_{k + 1:08d}.JPEG")]
    (src / "in1k-validation-00.tar").write_bytes(tar_bytes(val))  # type: ignore[arg-type]
    class_tree(tmp_path / "tree", {wnids[label]: [(name, photo) for name, photo, of in train if of == label] for label in wnids})

    pack(src, tmp_path / "from-wds", workers=1, progress=False)
    pack(tmp_path / "tree", tmp_path / "from-tree", workers=1, progress=False)
    packed = load_manifest(tmp_path / "from-wds")
    assert packed.classes == list(wnids.values()) == load_manifest(tmp_path / "from-tree").classes
    trains = {name: data for name, data in shard_files(tmp_path / "from-wds").items() if name.startswith("train")}
    assert trains == shard_files(tmp_path / "from-tree")
    assert sorted(np.load(tmp_path / "from-wds" / "val.labels.npy").tolist()) == [1, 2]  # wnids[5], wnids[17]

    pack(src, tmp_path / "val-alone", splits=["val"], workers=1, progress=False)
    assert load_manifest(tmp_path / "val-alone").classes == ["05", "17"]
    swapped = [(wnids[{0: 5, 5: 0}.get(label, label)] + name[9:], photo, label) for name, photo, label in train]
    members = [m for k, (name, photo, label) in enumerate(swapped) for m in wds_sample(f"s{k:02d}", photo, label, name)]
    (src / "in1k-train-0000.tar").write_bytes(tar_bytes(members))  # type: ignore[arg-type]
    pack(src, tmp_path / "swapped", workers=1, progress=False)
    assert load_manifest(tmp_path / "swapped").classes == ["00", "05", "17"]
