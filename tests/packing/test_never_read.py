"""What pack never reads: a file that is not a regular file (a character device, a FIFO), and a file or archive member
too large for a RecordIO record. Each is left out of the plan from its ``stat`` (or its header) without being read,
listed as skipped with its reason, and counts in no shard's size; a file that changes between the plan and its read
is read no further than the plan's size. Packs run as subprocesses held to a memory limit and a timeout, so that a
read of ``/dev/zero`` or of 3 GiB fails them rather than the machine, and a FIFO opened for reading ends in the timeout.
"""

from __future__ import annotations

import gzip
import io
import os
import resource
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from imgpipe.errors import DatasetError
from imgpipe.format.manifest import load_manifest
from imgpipe.format.verify import verify
from imgpipe.ingest.streams import StreamUnit
from imgpipe.packing.filereads import FileReads
from imgpipe.packing.packer import pack
from imgpipe.synth.tree import make_synthetic

SYNTH = dict(classes=3, per_class=4, val_per_class=0, seed=7, min_side=32, max_side=64, progress=False)
MEMORY_LIMIT = 2 << 30  # address space of a pack subprocess: less than the 3 GiB files here
HUGE = 3 << 30
COMPARED = (".rec", ".idx", ".npy", ".txt")
NOT_REGULAR = "not a regular file ({}); only regular files are packed"


def too_large(size: int) -> str:
    return f"too large for a RecordIO record ({size:,} bytes; a record holds under 512 MiB with its header): not read; shrink it"


def bounded_pack(src: Path, dst: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``imgpipe pack SRC DST`` held to MEMORY_LIMIT of address space and 60 s."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    command = [sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), "--workers", "2", "--no-progress", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, preexec_fn=limit)


def shard_files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name.endswith(COMPARED)}


def skipped(dst: Path) -> list[tuple[str, str]]:
    return [(s.path, s.reason) for s in load_manifest(dst).skipped]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("never-read") / "src"
    make_synthetic(root, **SYNTH)  # type: ignore[arg-type]
    return root


@pytest.fixture(scope="module")
def packed(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``tree`` packed with --shards 2 and with the default shard size."""
    base = tmp_path_factory.mktemp("never-read-packed")
    pack(tree, base / "two", shards=2, workers=2, progress=False)
    pack(tree, base / "default", workers=2, progress=False)
    return {"two": base / "two", "default": base / "default"}


def make_odd_file(kind: str, path: Path) -> str:
    """A file of ``kind`` at ``path``; what it is, as pack names it."""
    if kind == "character device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))  # /dev/zero's numbers: an endless source of zeros
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD (the link to /dev/zero is the same case without it)")
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)  # no writer: a read would wait for ever
    return "a FIFO" if kind == "FIFO" else "a character device"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["character device", "link to /dev/zero", "FIFO"])
def test_a_file_that_is_not_a_regular_file_is_listed_and_never_read(kind: str, tree: Path, packed: dict[str, Path], tmp_path: Path) -> None:
    src = Path(shutil.copytree(tree, tmp_path / "src"))
    wnid = sorted(os.listdir(src / "train"))[1]
    what = make_odd_file(kind, src / "train" / wnid / "odd.JPEG")
    result = bounded_pack(src, tmp_path / "out", "--shards", "2")
    assert result.returncode == 0, result.stderr
    assert skipped(tmp_path / "out") == [(f"train/{wnid}/odd.JPEG", NOT_REGULAR.format(what))]
    assert f"train/{wnid}/odd.JPEG: {NOT_REGULAR.format(what)}" in result.stdout
    assert shard_files(tmp_path / "out") == shard_files(packed["two"])  # planned as if it were not there
    assert verify(tmp_path / "out", workers=1, progress=False).ok


@pytest.mark.timeout(120)
def test_a_file_too_large_for_a_record_is_left_out_unread_and_out_of_the_shard_sizing(
    tree: Path, packed: dict[str, Path], tmp_path: Path
) -> None:
    src = Path(shutil.copytree(tree, tmp_path / "src"))
    wnid = sorted(os.listdir(src / "train"))[0]
    with open(src / "train" / wnid / "huge.JPEG", "wb") as huge:
        huge.truncate(HUGE)  # sparse: 3 GiB that take no room on the disk
    result = bounded_pack(src, tmp_path / "out")  # the default 256 MB shards: counted, it would make 13 of them
    assert result.returncode == 0, result.stderr
    assert skipped(tmp_path / "out") == [(f"train/{wnid}/huge.JPEG", too_large(HUGE))]
    assert "but only" not in result.stderr  # no "--shard-size ... (13 shards) but only 12 image(s)"
    assert shard_files(tmp_path / "out") == shard_files(packed["default"])
    assert verify(tmp_path / "out", workers=1, progress=False).ok


def sparse_tar(path: Path, members: list[tuple[str, bytes]], huge: str | None) -> None:
    """A tar of ``members`` and then a member ``huge`` of HUGE bytes, its data a hole in the file (and its end blocks)."""
    buffer = io.BytesIO()
    archive = tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT)
    for name, data in members:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    head, size = buffer.getvalue(), 0  # tarfile has not written its end blocks: it is not closed
    if huge is not None:
        info = tarfile.TarInfo(huge)
        info.size = size = HUGE
        head += info.tobuf(tarfile.GNU_FORMAT)
    path.write_bytes(head)
    os.truncate(path, len(head) + size + 2 * 512)  # HUGE is a multiple of 512; the end-of-archive blocks are zeros


def claimed_zip(path: Path, members: list[tuple[str, bytes]], huge: str) -> None:
    """A zip of ``members`` and then a deflated member ``huge`` whose headers claim HUGE bytes (its stream, 3.2 MB, could
    give that many: 1,032 per byte at most)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
        archive.writestr(huge, np.random.default_rng(0).bytes(3_200_000))
    with zipfile.ZipFile(path) as archive:
        local, directory = archive.getinfo(huge).header_offset, archive.start_dir
    data = bytearray(path.read_bytes())
    central = data.rindex(b"PK\x01\x02", directory)  # the last entry of the central directory: huge's
    for at in (local + 22, central + 24):  # the uncompressed size, in the local header and in the directory
        data[at : at + 4] = HUGE.to_bytes(4, "little")
    path.write_bytes(bytes(data))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["synset-tars", "kaggle-zip"])
def test_an_archive_member_that_declares_a_size_too_large_for_a_record_is_left_out_unread(layout: str, tree: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    wnids = sorted(os.listdir(tree / "train"))
    images = {wnid: [(p.name, p.read_bytes()) for p in sorted((tree / "train" / wnid).iterdir())] for wnid in wnids}
    if layout == "synset-tars":
        for wnid in wnids:
            sparse_tar(src / f"{wnid}.tar", images[wnid], "huge.JPEG" if wnid == wnids[0] else None)
        expected = f"{wnids[0]}.tar/huge.JPEG"
    else:
        folder = "ILSVRC/Data/CLS-LOC/train"
        members = [(f"{folder}/{wnid}/{name}", data) for wnid in wnids for name, data in images[wnid]]
        claimed_zip(src / "imagenet-object-localization-challenge.zip", members, f"{folder}/{wnids[0]}/huge.JPEG")
        expected = f"imagenet-object-localization-challenge.zip/{folder}/{wnids[0]}/huge.JPEG"
    result = bounded_pack(src, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert skipped(tmp_path / "out") == [(expected, too_large(HUGE))]
    assert "but only" not in result.stderr
    assert load_manifest(tmp_path / "out").splits["train"].records == sum(map(len, images.values()))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [False, True])
def test_a_file_that_changed_since_the_plan_is_read_no_further_than_the_plan_says(threads: bool, tmp_path: Path) -> None:
    """Between the plan and the read a file may be swapped for a FIFO or a device, or grow: none is read beyond the
    planned bytes, and each gives its reason (a FIFO opened for reading would wait for ever)."""
    (tmp_path / "same").write_bytes(b"x" * 100)
    (tmp_path / "grown").write_bytes(b"y" * 200)
    (tmp_path / "shrunk").write_bytes(b"z" * 50)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    names = ["same", "grown", "shrunk", "fifo", "zero", "gone"]
    reads = FileReads(os.path.join(tmp_path, ""), names, np.array([100, 100, 100, 100, 100, 100]), threads)
    assert list(reads.read()) == [
        b"x" * 100,
        "changed since the pack was planned (100 bytes then, 200 now); rerun with --overwrite to pack it",
        "changed since the pack was planned (100 bytes then, 50 now); rerun with --overwrite to pack it",
        NOT_REGULAR.format("a FIFO"),
        NOT_REGULAR.format("a character device"),
        "unreadable (No such file or directory)",
    ]


def test_a_tar_gz_member_that_changed_since_it_was_listed_is_one_line_before_its_read(tmp_path: Path) -> None:
    """A ``.tar.gz`` is read from its start: its member's header, not the listing, says how many bytes follow. One
    that differs from the listing stops the pack before its bytes are read."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("a_n01440764.JPEG")
        info.size = 1000
        archive.addfile(info, io.BytesIO(b"x" * 1000))
    path = tmp_path / "train_images_0.tar.gz"
    path.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))
    assert list(StreamUnit(path).read(np.array([0]), np.array([1000]))) == [(0, b"x" * 1000)]
    with pytest.raises(DatasetError, match=r"member a_n01440764.JPEG is 1,000 bytes, 10 when it was listed; it changed since"):
        next(StreamUnit(path).read(np.array([0]), np.array([10])))


def test_a_source_of_nothing_but_files_that_are_not_regular_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "src" / "A").mkdir(parents=True)
    (tmp_path / "src" / "A" / "zero.JPEG").symlink_to("/dev/zero")
    result = bounded_pack(tmp_path / "src", tmp_path / "out")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("imgpipe: error:")]
    first = f"train: A/zero.JPEG: {NOT_REGULAR.format('a character device')}"
    assert errors == [f"imgpipe: error: every source image was skipped (first: {first}); nothing to pack"]
    assert "but only 0 image(s)" not in result.stderr


@pytest.mark.timeout(120)
def test_a_link_loop_in_a_flat_val_folder_or_beside_the_splits_is_skipped_not_the_end_of_the_scan(tmp_path: Path) -> None:
    """A link to itself (ELOOP) in val/ stopped the scan ('cannot read it ... then rerun'); in a class folder it was skipped."""
    src = tmp_path / "src"
    make_synthetic(src, **{**SYNTH, "val_per_class": 1})  # type: ignore[arg-type]
    name = "ILSVRC2012_val_90000001.JPEG"
    (src / "val" / name).symlink_to(name)
    with open(src / "LOC_val_solution.csv", "a") as csv:
        csv.write(f"ILSVRC2012_val_90000001,{sorted(os.listdir(src / 'train'))[0]} 1 1 2 2\n")
    (src / "loop").symlink_to("loop")
    result = bounded_pack(src, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert skipped(tmp_path / "out") == [(f"val/{name}", "unreadable (Too many levels of symbolic links)")]
    assert load_manifest(tmp_path / "out").splits["val"].records == 3
