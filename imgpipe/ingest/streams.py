"""Sources read from the start, not at an offset: a ``.tar.gz`` (gzip has no random access) and a
Parquet file (read a row group at a time: its pages are compressed together). Each is a
``StreamUnit``; an item is the member at an *ordinal* of its unit: the k-th regular member of
the tar in stream order, or row k of the file. ``StreamUnit.read`` yields the wanted
ordinals' bytes in one pass and stops after the last one wanted (a Parquet file also skips
the row groups it does not need), so resuming a unit re-reads it only up to where the work
left off. ``scatter`` writes the shards from these reads.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np

from imgpipe._sys.oserrors import advice, describe
from imgpipe.errors import DatasetError
from imgpipe.ingest import fastzlib, tarwalk
from imgpipe.ingest.tarwalk import TarEntry

READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class StreamUnit:
    """A ``.tar.gz`` read from its start, or a Parquet file read a row group at a time."""

    path: Path
    parquet: bool = False

    def __str__(self) -> str:
        return str(self.path)

    def read(self, wanted: np.ndarray, sizes: np.ndarray) -> Iterator[tuple[int, bytes]]:
        """(ordinal, bytes) of each of the sorted ``wanted`` ordinals, in order; ``sizes``: their bytes as listed, no
        more of which a tar member is read (a Parquet file is read a row group at a time)."""
        if len(wanted) == 0:
            return iter(())
        if self.parquet:
            from imgpipe.ingest.parquet import read_rows

            return read_rows(self.path, wanted)
        return _tar_gz_members(self.path, wanted, sizes)


@dataclass(frozen=True)
class StreamItems:
    """Per item: its unit, its ordinal there, its size."""

    units: tuple[StreamUnit, ...]
    unit: np.ndarray  # int32
    ordinals: np.ndarray  # int64
    sizes: np.ndarray  # int64

    def take(self, index: np.ndarray | slice) -> "StreamItems":
        return StreamItems(self.units, self.unit[index], self.ordinals[index], self.sizes[index])


class ForwardFile(io.RawIOBase):
    """A stream read front to back as a seekable file: a seek forward skips (read into a scratch buffer), one
    backward fails. tarfile's normal mode reads a tar with seeks forward only, and copies less than its stream mode."""

    def __init__(self, stream: io.BufferedReader, raw: IO[bytes]) -> None:
        self.stream, self.raw, self.position = stream, raw, 0
        self.scratch = memoryview(bytearray(READ_BUFFER))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def read(self, size: int | None = -1) -> bytes:
        data = self.stream.read(size)
        self.position += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        count = self.stream.readinto(buffer)
        self.position += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset + (self.position if whence == io.SEEK_CUR else 0)
        if whence == io.SEEK_END or target < self.position:
            raise io.UnsupportedOperation(f"seek back to byte {target} of a gzip stream at byte {self.position}")
        while self.position < target and (count := self.stream.readinto(self.scratch[: min(len(self.scratch), target - self.position)])):
            self.position += count
        return self.position

    def close(self) -> None:
        self.stream.close()
        self.raw.close()
        super().close()


def open_tar_gz(path: Path) -> ForwardFile:
    """The decompressed ``path``, read front to back (gzip's own checks: a truncated file or a bad crc32 raise)."""
    raw = open(path, "rb")
    return ForwardFile(io.BufferedReader(fastzlib.open_gzip(raw), READ_BUFFER), raw)  # type: ignore[arg-type]


def broken_tar_gz(path: Path, error: BaseException, last: str) -> DatasetError:
    """A file the OS will not read says why; a damaged one, to download it again."""
    if isinstance(error, OSError) and advice(error, writing=False):
        return DatasetError(f"{path}: cannot read it: {describe(error, writing=False)}")
    return DatasetError(f"{path}: truncated or corrupt .tar.gz ({error or type(error).__name__}) after {last}; download it again and rerun")


GZIP_ERRORS = (tarfile.TarError, EOFError, gzip.BadGzipFile, OSError, *fastzlib.ERRORS)


def list_tar_gz(path: Path) -> list[TarEntry]:
    """Every member of the ``.tar.gz`` in stream order; a regular member's ``offset`` is its ordinal.

    Reads to the end of the gzip stream, so a truncated download or a bad crc32 is a
    DatasetError naming the archive and the last member read.
    """
    if path.stat().st_size == 0:
        raise DatasetError(f"{path}: an empty file (0 bytes), not a .tar.gz; download it again and rerun")
    try:
        return _list_tar_gz(path, plain=True)
    except tarwalk.Unsupported:  # a header tarwalk leaves to tarfile: list it again, all of it by tarfile
        return _list_tar_gz(path, plain=False)


def _list_tar_gz(path: Path, plain: bool) -> list[TarEntry]:
    entries: list[TarEntry] = []
    last = "its first member"
    ordinal = 0
    try:
        with open_tar_gz(path) as stream:
            for member in tarwalk.walk_file(stream, plain):  # type: ignore[arg-type]
                offset = -1
                if member.type in tarfile.REGULAR_TYPES:
                    offset, ordinal = ordinal, ordinal + 1
                name = member.name[2:] if member.name.startswith("./") else member.name
                entries.append(TarEntry(name, offset, member.size, member.type, member.linkname))
                last = f"member {name}"
            while stream.readinto(stream.scratch):  # the gzip trailer: its crc32 and length are checked at the end
                pass
    except GZIP_ERRORS as e:
        raise broken_tar_gz(path, e, last) from None
    return entries


def _tar_gz_members(path: Path, wanted: np.ndarray, sizes: np.ndarray) -> Iterator[tuple[int, bytes]]:
    given = 0
    try:
        for item in _wanted_members(path, wanted, sizes, plain=True):
            yield item
            given += 1
    except tarwalk.Unsupported:  # read again by tarfile from the first member not given yet
        yield from _wanted_members(path, wanted[given:], sizes[given:], plain=False)


def _wanted_members(path: Path, wanted: np.ndarray, sizes: np.ndarray, plain: bool) -> Iterator[tuple[int, bytes]]:
    last = "its first member"
    targets = iter(zip(wanted.tolist(), sizes.tolist()))
    target, size = next(targets)
    ordinal = 0
    try:
        with open_tar_gz(path) as stream:
            walk = tarwalk.walk_file(stream, plain)  # type: ignore[arg-type]
            for member in walk:
                if member.type not in tarfile.REGULAR_TYPES:
                    continue
                if ordinal == target:
                    if member.size != size:
                        raise DatasetError(
                            f"{path}: member {member.name} is {member.size:,} bytes, {size:,} when it was listed; it changed since: "
                            "rerun to list it again"
                        )
                    data = walk.data(member)
                    if len(data) != member.size:
                        raise EOFError(f"member {member.name} ends early")
                    yield ordinal, data
                    target, size = next(targets, (None, 0))
                    if target is None:
                        return
                last = f"member {member.name}"
                ordinal += 1
    except GZIP_ERRORS as e:
        raise broken_tar_gz(path, e, last) from None
    raise DatasetError(f"{path}: has {ordinal} files, fewer than when it was listed; it changed since: rerun to list it again")
