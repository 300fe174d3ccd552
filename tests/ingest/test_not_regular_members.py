"""Archive members that are not regular files (links, devices, FIFOs) are skipped and listed, as webdataset skips them.

In every layout's archives such a member named like an image is listed as skipped with its reason and never read,
and the shards are byte-identical to those of the archive without it. Archives are real: made by Python's
``tarfile`` and ``zipfile`` from ``imgpipe synth``'s layouts, and by GNU tar itself.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Callable

import pytest

from imgpipe.errors import DatasetError
from imgpipe.format.manifest import load_manifest
from imgpipe.format.verify import verify
from imgpipe.packing.packer import pack
from imgpipe.synth.tree import make_synthetic

SYNTH = dict(classes=3, per_class=3, val_per_class=2, seed=5, min_side=32, max_side=64, progress=False)
OPTIONS = dict(shards="train=2,val=1", workers=2, progress=False)
COMPARED = (".rec", ".idx", ".npy", ".txt")
SYMLINK = "not a regular file (a symbolic link to '{}'); only regular files are packed"
HARD_LINK = "not a regular file (a hard link to '{}'); only regular files are packed"
DEVICE = "not a regular file (a character device); only regular files are packed"
FIFO = "not a regular file (a FIFO); only regular files are packed"


def shard_files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name.endswith(COMPARED)}


def header(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime, info.mode = kind, target, 0, 0o644
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 5  # /dev/zero, were it extracted
    return info


Extra = list[tuple[tarfile.TarInfo, bytes]]


def rewrite_tar(path: Path, extra: Callable[[list[str]], Extra], gz: bool = False) -> None:
    """The tar (or .tar.gz) at ``path`` again, with the members ``extra(names of its members)`` gives appended."""
    with tarfile.open(path) as original:
        members = [(m, original.extractfile(m).read() if m.isreg() else b"") for m in original.getmembers()]  # type: ignore[union-attr]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for member, data in [*members, *extra([m.name for m, _ in members])]:
            member.size = len(data) if member.isreg() else 0
            archive.addfile(member, io.BytesIO(data) if member.isreg() else None)
    path.write_bytes(gzip.compress(buffer.getvalue(), mtime=0) if gz else buffer.getvalue())


def tarballs(src: Path) -> list[tuple[str, str]]:
    names: list[str] = []

    def odd(members: list[str]) -> Extra:
        names.extend(members)
        return [
            (header("ILSVRC2012_val_90000001.JPEG", tarfile.SYMTYPE, members[0]), b""),
            (header("ILSVRC2012_val_90000002.JPEG", tarfile.LNKTYPE, members[1]), b""),
            (header("ILSVRC2012_val_90000003.JPEG", tarfile.CHRTYPE), b""),
            (header("ILSVRC2012_val_90000004.JPEG", tarfile.FIFOTYPE), b""),
            (header("README", tarfile.SYMTYPE, "/etc/hostname"), b""),  # not named like an image: ignored, as other files are
        ]

    rewrite_tar(src / "ILSVRC2012_img_val.tar", odd)
    val = "ILSVRC2012_img_val.tar/ILSVRC2012_val_9000000{}.JPEG"
    return [(val.format(1), SYMLINK.format(names[0])), (val.format(2), HARD_LINK.format(names[1])),
            (val.format(3), DEVICE), (val.format(4), FIFO)]  # fmt: skip


def wds(src: Path) -> list[tuple[str, str]]:
    shard = sorted(src.glob("*-train-*.tar"))[0]
    names: list[str] = []

    def odd(members: list[str]) -> Extra:
        names.extend(members)
        label = (header("zz.cls", tarfile.REGTYPE), b"0")  # a sample whose image is a link: skipped with it, not one without an image
        return [(header("zz.jpg", tarfile.SYMTYPE, members[0]), b""), label, (header("yy.png", tarfile.CHRTYPE), b"")]

    rewrite_tar(shard, odd)
    return [(f"{shard.name}/zz.jpg", SYMLINK.format(names[0])), (f"{shard.name}/yy.png", DEVICE)]


def hf_tar(src: Path) -> list[tuple[str, str]]:
    archive = src / "data" / "train_images_0.tar.gz"
    names: list[str] = []

    def odd(members: list[str]) -> Extra:
        wnid = members[0][-len("n00000000.JPEG") : -len(".JPEG")]
        names.extend([f"link_{wnid}.JPEG", f"device_{wnid}.JPEG", members[0]])
        return [(header(names[0], tarfile.SYMTYPE, members[0]), b""), (header(names[1], tarfile.CHRTYPE), b"")]

    rewrite_tar(archive, odd, gz=True)
    return [(f"data/train_images_0.tar.gz/{names[0]}", SYMLINK.format(names[2])), (f"data/train_images_0.tar.gz/{names[1]}", DEVICE)]


def kaggle_zip(src: Path) -> list[tuple[str, str]]:
    path = src / "imagenet-object-localization-challenge.zip"
    with zipfile.ZipFile(path, "a") as archive:
        folder = archive.infolist()[0].filename.rsplit("/", 1)[0]
        for name, mode, data in (("link.JPEG", stat.S_IFLNK | 0o777, b"n0_0.JPEG"), ("device.JPEG", stat.S_IFCHR | 0o644, b"")):
            info = zipfile.ZipInfo(f"{folder}/{name}")
            info.external_attr, info.create_system = mode << 16, 3
            archive.writestr(info, data)
    return [(f"{path.name}/{folder}/link.JPEG", "not a regular file (a symbolic link); only regular files are packed"),
            (f"{path.name}/{folder}/device.JPEG", DEVICE)]  # fmt: skip


LAYOUTS = {"tarballs": tarballs, "wds": wds, "hf-tar": hf_tar, "kaggle-zip": kaggle_zip}


@pytest.fixture(scope="module")
def layouts(archives: Path) -> Path:
    """``archives``, with each of ``LAYOUTS`` packed as it is (``<layout>-packed/``)."""
    for name in LAYOUTS:
        pack(archives / name, archives / f"{name}-packed", **OPTIONS)  # type: ignore[arg-type]
    return archives


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_member_that_is_not_a_regular_file_is_listed_as_skipped_and_never_read(layout: str, layouts: Path, tmp_path: Path) -> None:
    src = Path(shutil.copytree(layouts / layout, tmp_path / layout))
    expected = LAYOUTS[layout](src)
    report = pack(src, tmp_path / "out", **OPTIONS)  # type: ignore[arg-type]
    odd = sorted((s.path, s.reason) for s in report.skipped if s.reason.startswith("not a regular file"))
    assert odd == sorted(expected)
    assert sorted((s.path, s.reason) for s in load_manifest(tmp_path / "out").skipped if s.reason.startswith("not a regular")) == odd
    packed = shard_files(tmp_path / "out")
    assert packed == shard_files(layouts / f"{layout}-packed")  # nothing of them in any shard or sidecar
    assert verify(tmp_path / "out", workers=1, progress=False).ok


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar makes the links and the appended duplicate")
def test_gnu_tars_links_are_listed_and_a_repeated_name_keeps_its_last_member(layouts: Path, tmp_path: Path) -> None:
    """GNU tar stores a second name of a file as a hard link, and ``tar -r`` appends a member whose name is already in the
    tar: the links are listed as skipped, and the repeated name is the file that extraction leaves, its last member."""
    tree = layouts / "tree"
    jpegs = sorted((tree / "val").iterdir())
    folder = tmp_path / "folder"
    folder.mkdir()
    for k in range(3):
        shutil.copy(jpegs[k], folder / jpegs[k].name)
    os.link(folder / jpegs[0].name, folder / "ILSVRC2012_val_90000001.JPEG")
    os.symlink(jpegs[1].name, folder / "ILSVRC2012_val_90000002.JPEG")
    src = tmp_path / "tars"
    src.mkdir()
    shutil.copy(layouts / "tarballs" / "ILSVRC2012_img_train.tar", src)
    shutil.copy(tree / "LOC_val_solution.csv", src)
    command = ["tar", "cf", str(src / "ILSVRC2012_img_val.tar"), "--sort=name", "-C", str(folder), "."]  # the 9000... name is the link
    subprocess.run(command, check=True, timeout=60)
    (tmp_path / "later").mkdir()
    shutil.copy(jpegs[3], tmp_path / "later" / jpegs[2].name)  # the same name, other bytes, appended
    subprocess.run(["tar", "rf", str(src / "ILSVRC2012_img_val.tar"), "-C", str(tmp_path / "later"), "./" + jpegs[2].name], check=True)
    extracted = tmp_path / "extracted"  # what the val tar holds as regular files, as extraction leaves them
    shutil.copytree(tree / "train", extracted / "train")
    shutil.copy(tree / "LOC_val_solution.csv", extracted)
    (extracted / "val").mkdir()
    for name, source in ((jpegs[0].name, jpegs[0]), (jpegs[1].name, jpegs[1]), (jpegs[2].name, jpegs[3])):
        shutil.copy(source, extracted / "val" / name)
    report = pack(src, tmp_path / "from-tar", **OPTIONS)  # type: ignore[arg-type]
    pack(extracted, tmp_path / "from-tree", **OPTIONS)  # type: ignore[arg-type]
    assert sorted((s.path, s.reason) for s in report.skipped) == [
        ("ILSVRC2012_img_val.tar/ILSVRC2012_val_90000001.JPEG", HARD_LINK.format("./" + jpegs[0].name)),
        ("ILSVRC2012_img_val.tar/ILSVRC2012_val_90000002.JPEG", SYMLINK.format(jpegs[1].name)),
    ]
    assert {k: v for k, v in shard_files(tmp_path / "from-tar").items() if not k.endswith(".txt")} == {
        k: v for k, v in shard_files(tmp_path / "from-tree").items() if not k.endswith(".txt")
    }


ARCHIVE_LAYOUTS = ("tarballs", "split-tar", "hf-parquet", "hf-tar", "wds", "kaggle-zip")


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each archive layout of one synthetic tree (``<layout>/``), and a folder of its synset tars (``synset-tars/``)."""
    base = tmp_path_factory.mktemp("archives")
    make_synthetic(base / "tree", **SYNTH)  # type: ignore[arg-type]
    for name in ARCHIVE_LAYOUTS:
        make_synthetic(base / name, layout=name, source=base / "tree", **SYNTH)  # type: ignore[arg-type]
    (base / "synset-tars").mkdir()
    for folder in sorted((base / "tree" / "train").iterdir()):
        with tarfile.open(base / "synset-tars" / f"{folder.name}.tar", "w") as archive:
            for image in sorted(folder.iterdir()):
                archive.add(image, image.name)
    return base


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "layout, name, kind",
    [
        ("tarballs", "ILSVRC2012_img_val.tar", "a link to /dev/zero"),
        ("tarballs", "ILSVRC2012_devkit_t12.tar.gz", "a FIFO"),
        ("split-tar", "ILSVRC2012_img_train.tar.002", "a link to nothing"),
        ("hf-parquet", "data/train-00001-of-00002.parquet", "a link to /dev/zero"),
        ("hf-tar", "data/val_images.tar.gz", "a FIFO"),
        ("wds", "imagenet1k-train-0001.tar", "a link to nothing"),
        ("kaggle-zip", "imagenet-object-localization-challenge.zip", "a link to /dev/zero"),
        ("synset-tars", "n*.tar", "a FIFO"),  # the last of them
    ],
)
def test_a_layouts_archive_that_is_not_a_regular_file_is_one_line_never_passed_over(
    layout: str, name: str, kind: str, archives: Path, tmp_path: Path
) -> None:
    """It was passed over without a word: the val tar or a shard of train left out of a pack that exited 0."""
    src = Path(shutil.copytree(archives / layout, tmp_path / layout))
    name = sorted(src.glob(name))[-1].relative_to(src).as_posix()
    (src / name).unlink()
    if kind == "a FIFO":
        os.mkfifo(src / name)
    else:
        os.symlink("/dev/zero" if kind == "a link to /dev/zero" else "nowhere", src / name)
    with pytest.raises(DatasetError) as error:
        pack(src, tmp_path / "out", **OPTIONS)  # type: ignore[arg-type]
    line = str(error.value)
    what = {
        "a FIFO": "not a regular file (a FIFO)",
        "a link to /dev/zero": "not a regular file (a character device)",
        "a link to nothing": "a symbolic link to 'nowhere', which does not exist",
    }[kind]
    assert line.startswith(f"{src / name}: {what}"), line
    assert "\n" not in line and "put the file itself there, or move it out of SRC" in line
    assert not (tmp_path / "out" / "manifest.json").exists()
