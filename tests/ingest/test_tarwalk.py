"""``tarwalk`` reads a tar as ``tarfile`` does: the same members from archives of every format and kind of
member, and on damaged archives the same members or the same one-line error, through ``list_tar``."""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from _bounded import allocated_by
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgpipe.errors import DatasetError
from imgpipe.ingest.imagenet_tars import Window, _listed, list_tar
from imgpipe.ingest.members import ArchiveFile, OpenArchive
from imgpipe.ingest.streams import list_tar_gz
from imgpipe.ingest.tarwalk import BLOCK, TarEntry, TarfileWalk, TarWalk, Unsupported

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


# ----------------------------------------------------------------------------- hostile headers

HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([-1, -512, -513, -1024, -1536, -(1 << 40), 0, 1, 511, 512, 8**11 - 1, 8**11, 1 << 40, 2**63, 256**11 - 1]),
    st.integers(-(2**80), 2**80),
)
FIELDS = {"size": (124, 12), "mode": (100, 8), "uid": (108, 8), "mtime": (136, 12), "devmajor": (329, 8)}
PAX_RECORDS = st.sampled_from(["size", "path", "linkpath", "GNU.sparse.size", "GNU.sparse.realsize", "GNU.sparse.map",
                               "GNU.sparse.major", "GNU.sparse.minor", "GNU.sparse.name", "hdrcharset", "mtime", "uid"])  # fmt: skip
PAX_VALUES = st.one_of(HOSTILE_NUMBERS.map(str), st.sampled_from(["", "1", "0", "BINARY", "1,2,3", "x,y", "-5,7", "1.0", "nan"]))


def number_field(value: int, width: int) -> bytes:
    """``value`` as tarfile would read it back: octal where it fits, else GNU base-256 (two's complement when negative)."""
    if 0 <= value < 8 ** (width - 1):
        return b"%0*o\0" % (width - 1, value)
    return (b"\xff" if value < 0 else b"\x80") + (value % 256 ** (width - 1)).to_bytes(width - 1, "big")


def set_field(data: bytearray, at: int, field: str, value: int) -> None:
    """Field ``field`` of the 512-byte block at ``at`` set to ``value``, the block's checksum made right again."""
    offset, width = FIELDS[field]
    data[at + offset : at + offset + width] = number_field(value, width)
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + BLOCK])


@st.composite
def hostile_tars(draw: st.DrawFn) -> bytes:
    """A small tar whose headers carry hostile numbers (negative, huge, base-256) and pax records (sizes, sparse maps)."""
    entries = draw(
        st.lists(st.tuples(paths, st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE]), st.integers(0, 1500)), min_size=1, max_size=5)
    )
    pax = draw(st.dictionaries(PAX_RECORDS, PAX_VALUES, max_size=3))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=draw(st.sampled_from(sorted(FORMATS.values())))) as tar:
        for k, (name, kind, size) in enumerate(entries):
            info = tarfile.TarInfo(name)
            info.type, info.mtime = kind, 0
            info.size = size if kind == tarfile.REGTYPE else 0
            if k == len(entries) - 1 and pax:
                info.pax_headers = pax
            tar.addfile(info, io.BytesIO(bytes(info.size)) if kind == tarfile.REGTYPE else None)
    data = bytearray(out.getvalue())
    headers = header_offsets(data)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.sampled_from(headers) | st.integers(0, len(data) // BLOCK - 1).map(lambda block: block * BLOCK))
        set_field(data, at, draw(st.sampled_from(sorted(FIELDS))), draw(HOSTILE_NUMBERS))
    return bytes(data)


def header_offsets(data: bytes) -> list[int]:
    """Where every header of a tar tarfile has just written lies (pax and long-name headers included)."""
    offsets, at = [], 0
    while at + BLOCK <= len(data) and data[at : at + BLOCK] != bytes(BLOCK):
        info = tarfile.TarInfo.frombuf(data[at : at + BLOCK], "utf-8", "surrogateescape")
        offsets.append(at)
        at += BLOCK + (-(-info.size // BLOCK) * BLOCK if info.type not in (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE) else 0)
    return offsets


@pytest.mark.timeout(300)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=hostile_tars())
def test_hostile_headers_are_listed_or_one_line_within_bounds_plain_and_gzipped(data: bytes, tmp_path: Path) -> None:
    """Whatever the numbers in its headers, a tar (a class tar, a shard) and the same tar gzipped are listed, or
    refused in one line, in bounded memory and time: no header moves the walk backward or is read without bound."""
    plain, gzipped = tmp_path / "hostile.tar", tmp_path / "hostile.tar.gz"
    plain.write_bytes(data)
    gzipped.write_bytes(gzip.compress(data, mtime=0))

    def list_plain() -> None:
        with OpenArchive(ArchiveFile.of(plain)) as source:
            for entry in list_tar(source, 0, source.size, str(plain), plain.name):
                assert entry.size >= 0 and 0 <= entry.offset <= entry.offset + entry.size <= source.size

    for listing in (list_plain, lambda: list_tar_gz(gzipped)):
        peak = allocated_by(listing, DatasetError)
        assert peak < 8 << 20, f"listing a tar of {len(data):,} bytes allocated {peak:,}"
