"""``tarwalk`` reads a tar as ``tarfile`` does: the same members from archives of every format and kind of
member, and on damaged archives the same members or the same one-line error, through ``list_tar``."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgpipe.errors import DatasetError
from imgpipe.ingest.imagenet_tars import Window, _listed, list_tar
from imgpipe.ingest.members import ArchiveFile, OpenArchive
from imgpipe.ingest.tarwalk import TarEntry, TarfileWalk, TarWalk, Unsupported

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
names = st.text(st.sampled_from("abcxyz_-.é0123456789"), min_size=1, max_size=12)
paths = st.lists(names, min_size=1, max_size=12).map("/".join)  # up to ~150 characters: ustar's prefix, GNU's and pax's long names
kinds = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE])
members = st.lists(st.tuples(paths, kinds, st.integers(0, 1500)), max_size=8)


def make_tar(entries: list[tuple[str, bytes, int]], fmt: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, kind, size in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.mtime = 1_700_000_000
            if kind == tarfile.REGTYPE:
                info.size = size
                tar.addfile(info, io.BytesIO(bytes([size % 251]) * size))
            else:
                info.linkname = "target" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
                tar.addfile(info)
    return out.getvalue()


def by_tarfile(data: bytes) -> tuple[list[TarEntry], int]:
    walk = TarfileWalk(io.BytesIO(data))
    return list(walk), walk.end


def by_tarwalk(data: bytes) -> tuple[list[TarEntry], int]:
    view = io.BytesIO(data)
    walk = TarWalk(view.read, lambda count: view.seek(count, io.SEEK_CUR))
    return list(walk), walk.end


@settings(max_examples=300, deadline=None)
@given(members, st.sampled_from(sorted(FORMATS)))
def test_the_walk_gives_tarfiles_members_or_leaves_the_tar_to_it(entries: list[tuple[str, bytes, int]], fmt: str) -> None:
    data = make_tar(entries, FORMATS[fmt])
    try:
        walked = by_tarwalk(data)
    except Unsupported:
        assert (
            fmt != "ustar"
            or any(len(name.encode()) > 100 for name, _, _ in entries)
            or any(ord(c) > 127 for name, _, _ in entries for c in name)
        )
        return
    assert walked == by_tarfile(data)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_plain_members_of_every_format_are_walked_not_left_to_tarfile(fmt: str) -> None:
    entries = [("train/n01440764/n01440764_10026.JPEG", tarfile.REGTYPE, 1000), ("train/n01440764", tarfile.DIRTYPE, 0),
               ("link", tarfile.SYMTYPE, 0), ("hard", tarfile.LNKTYPE, 0), ("empty.JPEG", tarfile.REGTYPE, 0)]  # fmt: skip
    data = make_tar(entries, FORMATS[fmt])
    walked = by_tarwalk(data)
    assert walked == by_tarfile(data) and len(walked[0]) == 5


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
@pytest.mark.parametrize("fmt", ["v7", "oldgnu", "gnu", "ustar", "posix"])
def test_gnu_tars_archives_read_alike(fmt: str, tmp_path: Path) -> None:
    (tmp_path / "src" / "n01440764").mkdir(parents=True)
    (tmp_path / "src" / "n01440764" / "a.JPEG").write_bytes(b"x" * 700)
    if fmt != "v7":  # a name over 100 bytes: ustar's prefix field, GNU's long name, pax's path (v7 holds none)
        (tmp_path / "src" / "n01440764" / ("d" * 60)).mkdir()
        (tmp_path / "src" / "n01440764" / ("d" * 60) / ("e" * 40 + ".JPEG")).write_bytes(b"y" * 3)
    (tmp_path / "src" / "link.JPEG").symlink_to("n01440764/a.JPEG")
    archive = tmp_path / "a.tar"
    subprocess.run(["tar", f"--format={fmt}", "-cf", str(archive), "-C", str(tmp_path / "src"), "."], check=True)
    with OpenArchive(ArchiveFile.of(archive)) as source:
        listed = list_tar(source, 0, source.size, str(archive), archive.name)
        reference = _listed(TarfileWalk(Window(source, 0, source.size)), source, 0, source.size, str(archive), archive.name)  # type: ignore[arg-type]
    assert listed == reference and {e.name for e in listed} >= {"n01440764/a.JPEG", "link.JPEG"}


def list_both(data: bytes, tmp_path: Path) -> tuple[object, object]:
    archive = tmp_path / "damaged.tar"
    archive.write_bytes(data)
    results = []
    with OpenArchive(ArchiveFile.of(archive)) as source:
        for listing in (lambda: list_tar(source, 0, source.size, "T", "T"),
                        lambda: _listed(TarfileWalk(Window(source, 0, source.size)), source, 0, source.size, "T", "T")):  # type: ignore[arg-type]  # fmt: skip
            try:
                results.append(listing())
            except DatasetError as e:
                results.append(str(e))
    return results[0], results[1]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=members,
    fmt=st.sampled_from(sorted(FORMATS)),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.floats(0.3, 1.0),
)
def test_a_damaged_tar_is_listed_or_refused_as_tarfile_does(
    entries: list[tuple[str, bytes, int]], fmt: str, flips: list[tuple[float, int]], cut: float, tmp_path: Path
) -> None:
    data = bytearray(make_tar(entries, FORMATS[fmt]))
    for where, value in flips:
        data[min(len(data) - 1, int(where * len(data)))] = value
    mine, reference = list_both(bytes(data[: max(1, int(cut * len(data)))]), tmp_path)
    assert mine == reference
