"""Where an item's bytes lie inside an archive, and how a worker reads them in place.

An ``ArchiveFile`` is one file, or a file cut into parts (``x.tar.001``, ``.002``, ...) read as one with
``pread`` across part boundaries (``open_archive``). ``MemberSpans`` says, per item, which archive and
where: a plain span (tar members, WebDataset samples) or a zip member at its local header (stored or
deflated, checked against the central directory's crc32). Arrays, not objects.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from imgpipe._sys.checksum import crc32
from imgpipe._sys.oserrors import describe
from imgpipe.errors import DatasetError
from imgpipe.ingest import fastzlib

SPAN, ZIP_STORED, ZIP_DEFLATED = range(3)
ZIP_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # signature ... file name length, extra field length
ZIP_LOCAL_SIGNATURE = 0x04034B50
MAX_OPEN_ARCHIVES = 64  # a shard of ImageNet-21k's synset tars reads from thousands of them; 1,024 files is a common ulimit


@dataclass(frozen=True)
class ArchiveFile:
    """An archive on disk: one file, or the parts of one file in order."""

    parts: tuple[Path, ...]

    @classmethod
    def of(cls, path: Path) -> "ArchiveFile":
        return cls((path,))

    @property
    def name(self) -> str:
        """The archive's file name; for parts, the name they make when joined (``x.tar.001`` -> ``x.tar``)."""
        first = self.parts[0].name
        return first.rsplit(".", 1)[0] if len(self.parts) > 1 else first

    def __str__(self) -> str:
        if len(self.parts) == 1:
            return str(self.parts[0])
        return f"{self.parts[0].parent / self.name}.{{{self.parts[0].suffix[1:]}..{self.parts[-1].suffix[1:]}}}"

    def size(self) -> int:
        return sum(part.stat().st_size for part in self.parts)


class OpenArchive:
    """An ``ArchiveFile`` opened for ``pread``: a read may cross the boundary between two parts."""

    def __init__(self, archive: ArchiveFile) -> None:
        self.archive = archive
        self.fds: list[int] = []
        try:
            for part in archive.parts:
                self.fds.append(os.open(part, os.O_RDONLY))
        except OSError as e:
            self.close()
            raise DatasetError(f"{e.filename}: cannot open it: {describe(e, writing=False)}") from None
        sizes = [os.fstat(fd).st_size for fd in self.fds]
        self.starts = np.cumsum([0, *sizes]).tolist()
        self.size = self.starts[-1]

    def pread(self, count: int, offset: int) -> bytes:
        """Up to ``count`` bytes at ``offset`` of the joined archive (fewer only at its end)."""
        if len(self.fds) == 1:
            return os.pread(self.fds[0], count, offset)
        chunks = []
        part = max(0, int(np.searchsorted(self.starts, offset, side="right")) - 1)
        while count > 0 and part < len(self.fds):
            chunk = os.pread(self.fds[part], count, offset - self.starts[part])
            chunks.append(chunk)
            count -= len(chunk)
            offset += len(chunk)
            part += 1
        return b"".join(chunks)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def __enter__(self) -> "OpenArchive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class MemberSpans:
    """Where each item lies: archive index, offset and size (kinds, zip sizes and crc32 where they apply)."""

    archives: tuple[ArchiveFile, ...]
    archive: np.ndarray  # int32, index into archives
    offsets: np.ndarray  # int64: the data (SPAN) or the zip local header
    sizes: np.ndarray  # int64: the item's bytes once read (uncompressed)
    kinds: np.ndarray | None = None  # int8, SPAN when None
    packed: np.ndarray | None = None  # int64, zip members: compressed size
    crcs: np.ndarray | None = None  # uint32, zip members: crc32 of the uncompressed bytes

    @classmethod
    def of(cls, archive: ArchiveFile, offsets: Sequence[int], sizes: Sequence[int], kinds: Sequence[int] | None = None) -> "MemberSpans":
        offsets = np.asarray(offsets, np.int64)
        kind_array = None if kinds is None or not np.any(np.asarray(kinds) != SPAN) else np.asarray(kinds, np.int8)
        return cls((archive,), np.zeros(len(offsets), np.int32), offsets, np.asarray(sizes, np.int64), kind_array)

    def take(self, index: np.ndarray | slice) -> "MemberSpans":
        """The items ``index``, with only the archives they lie in (a shard of ImageNet-21k's synset tars
        goes to its worker with the few thousand tars it reads, not all 22 k)."""
        pick = lambda a: None if a is None else a[index]  # noqa: E731
        archive = self.archive[index]
        used = np.bincount(archive, minlength=len(self.archives)) > 0
        archives = self.archives
        if not used.all():
            archives = tuple(a for a, keep in zip(self.archives, used.tolist()) if keep)
            archive = (np.cumsum(used, dtype=np.int32) - 1)[archive]
        return MemberSpans(archives, archive, self.offsets[index], self.sizes[index],
                           pick(self.kinds), pick(self.packed), pick(self.crcs))  # fmt: skip

    @classmethod
    def concat(cls, parts: Sequence["MemberSpans"]) -> "MemberSpans":
        """One MemberSpans of ``parts`` in order, their archives merged."""
        archives: dict[ArchiveFile, int] = {}
        for part in parts:
            for archive in part.archives:
                archives.setdefault(archive, len(archives))
        remapped = [np.array([archives[a] for a in part.archives], np.int32)[part.archive] for part in parts]

        def joined(get: Callable[["MemberSpans"], np.ndarray | None], dtype: type, fill: int) -> np.ndarray | None:
            if all(get(part) is None for part in parts):
                return None
            return np.concatenate([np.full(len(part.offsets), fill, dtype) if get(part) is None else get(part) for part in parts])

        empty = np.zeros(0, np.int64)
        return cls(
            tuple(archives), np.concatenate(remapped) if parts else np.zeros(0, np.int32),
            np.concatenate([p.offsets for p in parts]) if parts else empty, np.concatenate([p.sizes for p in parts]) if parts else empty,
            joined(lambda p: p.kinds, np.int8, SPAN), joined(lambda p: p.packed, np.int64, 0), joined(lambda p: p.crcs, np.uint32, 0),
        )  # fmt: skip


@contextlib.contextmanager
def member_reader(spans: MemberSpans) -> Iterator[Callable[[int, str], bytes]]:
    """``read(k, name)``: item ``k``'s bytes, never more than its span; archives opened on first use.

    ``name`` (the item's source path) names the member in errors: an archive that changed
    since the scan, or a zip member whose bytes do not match its crc32, stops the pack. At most
    ``MAX_OPEN_ARCHIVES`` stay open, the least recently read closed first.
    """
    opened: OrderedDict[int, OpenArchive] = OrderedDict()

    def read(k: int, name: str) -> bytes:
        kind = SPAN if spans.kinds is None else int(spans.kinds[k])
        index = int(spans.archive[k])
        source = opened.get(index)
        if source is None:
            if len(opened) >= MAX_OPEN_ARCHIVES:
                opened.popitem(last=False)[1].close()
            source = opened[index] = OpenArchive(spans.archives[index])
        else:
            opened.move_to_end(index)
        size, offset = int(spans.sizes[k]), int(spans.offsets[k])
        if kind == SPAN:
            return _exact(source.pread(size, offset), size, source.archive, name)
        return _zip_member(source, offset, int(spans.packed[k]), size, int(spans.crcs[k]), kind == ZIP_DEFLATED, name)  # type: ignore[index]

    try:
        yield read
    finally:
        for source in opened.values():
            source.close()


def _exact(data: bytes, size: int, archive: ArchiveFile, name: str) -> bytes:
    if len(data) != size:
        raise DatasetError(
            f"{name}: {archive} ends inside this member ({len(data)} of {size} bytes); it changed since the scan: "
            f"download it again and rerun (the records written are kept)"
        )
    return data


def _zip_member(source: OpenArchive, header_at: int, packed: int, size: int, crc: int, deflated: bool, name: str) -> bytes:
    """The bytes of the zip member whose local header is at ``header_at``, checked against the central directory."""
    corrupt = f"{name}: corrupt zip member in {source.archive}"
    redownload = "download the zip again and rerun (the records written are kept)"
    head = source.pread(ZIP_LOCAL_HEADER.size, header_at)
    if len(head) < ZIP_LOCAL_HEADER.size or ZIP_LOCAL_HEADER.unpack(head)[0] != ZIP_LOCAL_SIGNATURE:
        raise DatasetError(f"{corrupt}: no local header at byte {header_at}; {redownload}")
    *_, name_length, extra_length = ZIP_LOCAL_HEADER.unpack(head)
    data = _exact(source.pread(packed, header_at + ZIP_LOCAL_HEADER.size + name_length + extra_length), packed, source.archive, name)
    if deflated:
        inflater = fastzlib.raw_inflater()
        try:
            data = inflater.decompress(data, size + 1)  # bounded: a corrupt stream cannot allocate more
        except fastzlib.ERRORS as e:
            raise DatasetError(f"{corrupt}: {e}; {redownload}") from None
        if not inflater.eof and len(data) <= size:
            raise DatasetError(f"{corrupt}: the deflate stream stops early; {redownload}")
    if len(data) != size or crc32(data) != crc:
        raise DatasetError(f"{corrupt}: its bytes do not match the zip's size and crc32; {redownload}")
    return data
