"""Links and repeated names inside a tar: the pack from the tar equals the pack of what GNU tar extracts.

Hard links take the bytes their target had when they were extracted, symbolic links read as
their final target, a repeated name keeps its last member; a link GNU tar cannot make is
left out, a dangling one is skipped as the extracted link is. Archives are made by Python's
tarfile and by GNU tar itself (hard links found by inode, ``tar -r`` appending a duplicate).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from imgpipe.ingest.imagenet_tars import TRAIN_TAR, VAL_TAR
from imgpipe.packing.packer import pack
from imgpipe.synth.tree import make_synthetic

pytestmark = pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is the reference extractor")

SYNTH = dict(classes=3, per_class=2, val_per_class=3, seed=5, min_side=32, max_side=64, progress=False)
COMPARED = (".rec", ".idx", ".labels.npy", ".crc32.npy", ".index.npy")


def val_name(k: int) -> str:
    return f"ILSVRC2012_val_{k:08d}.JPEG"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[bytes], Path]:
    """Nine distinct small JPEGs and the synthetic dataset's folder: its tree and its train tar (the val tar is the test's)."""
    base = tmp_path_factory.mktemp("links")
    make_synthetic(base / "tree", **SYNTH)
    make_synthetic(base / "tars", tars=True, **SYNTH)
    return [(base / "tree" / "val" / val_name(k)).read_bytes() for k in range(1, 10)], base


def packed(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name.endswith(COMPARED)}


def extract_and_compare(
    archive: Path, csv: Path, synthetic: Path, tmp_path: Path, class_tar: tuple[str, bytes] | None = None
) -> tuple[object, object]:
    """Pack the val tar in place and the val folder GNU tar extracts from it, beside the same train
    images as a train tar and as a tree (``class_tar``: (wnid, bytes) replaces that class's tar and
    folder); the shards must be byte-identical."""
    src = tmp_path / "tars"
    src.mkdir()
    tree = tmp_path / "tree"
    shutil.copytree(synthetic / "tree" / "train", tree / "train")
    if class_tar is None:
        os.link(synthetic / "tars" / TRAIN_TAR, src / TRAIN_TAR)
    else:
        wnid, data = class_tar
        with tarfile.open(synthetic / "tars" / TRAIN_TAR) as original, tarfile.open(src / TRAIN_TAR, "w") as train:
            for member in original.getmembers():
                member_data = data if member.name == f"{wnid}.tar" else original.extractfile(member).read()  # type: ignore[union-attr]
                member.size = len(member_data)
                train.addfile(member, io.BytesIO(member_data))
        shutil.rmtree(tree / "train" / wnid)
        (tree / "train" / wnid).mkdir()
        (tmp_path / f"{wnid}.tar").write_bytes(data)
        subprocess.run(["tar", "xf", str(tmp_path / f"{wnid}.tar"), "-C", str(tree / "train" / wnid)], check=True, timeout=60)
    shutil.copy(archive, src / VAL_TAR)
    shutil.copy(csv, src)
    (tree / "val").mkdir()
    subprocess.run(["tar", "xf", str(archive), "-C", str(tree / "val")], capture_output=True, timeout=60)  # may exit 2 on a bad link
    shutil.copy(csv, tree)
    options = dict(shards=2, workers=1, progress=False)
    from_tree = pack(tree, tmp_path / "from-tree", **options)
    from_tar = pack(src, tmp_path / "from-tar", **options)
    assert packed(tmp_path / "from-tar") == packed(tmp_path / "from-tree")
    assert len(packed(tmp_path / "from-tree")) == 2 * (2 * 2 + 3)
    return from_tree, from_tar


def add(archive: tarfile.TarFile, name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime, info.mode = kind, link, 0, 0o644
    info.size = len(data) if data is not None else 0
    archive.addfile(info, io.BytesIO(data) if data is not None else None)


@pytest.mark.timeout(120)
def test_python_tarfile_links_and_duplicates_pack_as_gnu_tar_extracts(images: tuple[list[bytes], Path], tmp_path: Path) -> None:
    jpegs, synthetic = images
    csv = synthetic / "tree" / "LOC_val_solution.csv"
    archive = tmp_path / "made-by-tarfile.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, val_name(1), jpegs[0])
        add(tar, val_name(2), jpegs[1])
        add(tar, val_name(3), kind=tarfile.LNKTYPE, link=val_name(2))  # val 2 as it is now: jpegs[1]
        add(tar, val_name(2), jpegs[2])  # a repeated name: the last member wins
        add(tar, val_name(4), kind=tarfile.SYMTYPE, link=val_name(2))  # reads the final val 2: jpegs[2]
        add(tar, val_name(5), kind=tarfile.SYMTYPE, link="./" + val_name(1))
        add(tar, val_name(6), kind=tarfile.SYMTYPE, link="nowhere.JPEG")  # dangling: skipped, as the extracted link is
        add(tar, val_name(7), kind=tarfile.LNKTYPE, link="later.JPEG")  # GNU tar cannot make it: left out
        add(tar, "later.JPEG", jpegs[3])
        add(tar, val_name(8), kind=tarfile.SYMTYPE, link="/etc/hostname")  # out of the archive: skipped with the reason
        add(tar, val_name(9), kind=tarfile.SYMTYPE, link="nofolder/../" + val_name(1))  # the kernel needs nofolder: dangling
    labels = tmp_path / "LOC_val_solution.csv"
    first_row = csv.read_text().splitlines()[1]
    labels.write_text(csv.read_text() + "later," + first_row.split(",", 1)[1] + "\n")
    wnid = sorted(p.name for p in (synthetic / "tree" / "train").iterdir())[1]
    class_tar = io.BytesIO()
    with tarfile.open(fileobj=class_tar, mode="w", format=tarfile.GNU_FORMAT) as tar:  # links across subfolders of a class tar
        add(tar, "sub", kind=tarfile.DIRTYPE)
        add(tar, "a.JPEG", jpegs[4])
        add(tar, "sub/b.JPEG", kind=tarfile.LNKTYPE, link="a.JPEG")
        add(tar, "sub/c.JPEG", kind=tarfile.SYMTYPE, link="../a.JPEG")
        add(tar, "alias", kind=tarfile.SYMTYPE, link="sub")  # a link to a folder: not walked, not an image
        add(tar, "d.JPEG", kind=tarfile.SYMTYPE, link="alias/../sub/b.JPEG")  # through the linked folder
        add(tar, "a.JPEG", jpegs[5])
    tree_report, tar_report = extract_and_compare(archive, labels, synthetic, tmp_path, (wnid, class_tar.getvalue()))
    tree_sources = (tmp_path / "from-tree" / "val.sources.txt").read_text().splitlines()
    tar_sources = (tmp_path / "from-tar" / "val.sources.txt").read_text().splitlines()
    assert [s.removeprefix(VAL_TAR + "/") for s in tar_sources] == [s.removeprefix("val/") for s in tree_sources]
    assert sorted(s.rsplit("/", 1)[-1] for s in tar_sources) == [
        *(val_name(k) for k in range(1, 6)),
        "later.JPEG",
    ]  # 6, 8, 9 skipped, 7 left out
    skipped = {s.path.rsplit("/", 1)[-1]: s.reason for s in tar_report.skipped}  # type: ignore[attr-defined]
    assert set(skipped) == {val_name(6), val_name(7), val_name(8), val_name(9)}
    assert "outside the archive" in skipped[val_name(8)] and "not extracted before it" in skipped[val_name(7)]
    assert {s.path.rsplit("/", 1)[-1] for s in tree_report.skipped} >= {val_name(6), val_name(9)}  # type: ignore[attr-defined]
    train_sources = (tmp_path / "from-tar" / "train.sources.txt").read_text().splitlines()
    assert sum(f"{wnid}.tar/" in s for s in train_sources) == 4  # a, d and sub/b, sub/c


@pytest.mark.timeout(120)
def test_gnu_tar_hard_links_symlinks_and_appended_duplicate(images: tuple[list[bytes], Path], tmp_path: Path) -> None:
    jpegs, synthetic = images
    folder = tmp_path / "folder"
    folder.mkdir()
    for k in (1, 2, 3):
        (folder / val_name(k)).write_bytes(jpegs[k - 1])
    os.link(folder / val_name(1), folder / val_name(4))  # GNU tar stores the second name as a hard link
    os.link(folder / val_name(2), folder / val_name(5))
    os.symlink(val_name(3), folder / val_name(6))
    os.symlink("./" + val_name(2), folder / val_name(7))
    archive = tmp_path / "made-by-gnu-tar.tar"
    subprocess.run(["tar", "cf", str(archive), "-C", str(folder), "."], check=True, timeout=60)
    replacement = tmp_path / "replacement"
    replacement.mkdir()
    (replacement / val_name(3)).write_bytes(jpegs[8])
    subprocess.run(["tar", "rf", str(archive), "-C", str(replacement), "./" + val_name(3)], check=True, timeout=60)
    with tarfile.open(archive) as tar:
        kinds = {m.name.removeprefix("./"): m.type for m in tar.getmembers()}
        assert [m.name for m in tar.getmembers()].count("./" + val_name(3)) == 2
    assert tarfile.LNKTYPE in kinds.values() and tarfile.SYMTYPE in kinds.values()
    _, tar_report = extract_and_compare(archive, synthetic / "tree" / "LOC_val_solution.csv", synthetic, tmp_path)
    assert not tar_report.skipped  # type: ignore[attr-defined]
    sources = (tmp_path / "from-tar" / "val.sources.txt").read_text().splitlines()
    assert len(sources) == 7 and len(set(sources)) == 7
