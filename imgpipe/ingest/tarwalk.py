"""Walk a tar's plain headers the way Python's ``tarfile`` reads them, for less CPU per member.

``walk`` decodes only a plain header's name, type, size and link (what it gains: docs/benchmarks.md);
anything else (a GNU long name, a pax or sparse header, a base-256 number, a bad checksum, a short
read, a field ``tarfile`` would refuse) raises ``Unsupported``, and the caller reads the archive with
``tarfile``, whose members and refusals stay its own. Rule: ``tarfile`` is only ever given
``CheckedTarInfo``: a header whose next offset does not move forward (a negative size, CVE-2025-8194)
or a long name or pax header larger than any real one is an ``UnsafeHeader`` before ``tarfile`` reads it.
"""

from __future__ import annotations

import functools
import io
import re
import struct
import tarfile
from typing import IO, Callable, Iterator, NamedTuple

BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(BLOCK)
_PLAIN_TYPES = frozenset((tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.LNKTYPE, tarfile.SYMTYPE, tarfile.DIRTYPE,
                          tarfile.FIFOTYPE, tarfile.CONTTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE))  # fmt: skip
_OCTAL = re.compile(rb" *[0-7]* *(?:\x00.*)?", re.S)  # a number field tarfile reads as octal, NUL-terminated or not
# name, mode, uid, gid, size, mtime, chksum, typeflag, linkname, (magic, version, uname, gname), devmajor, devminor, prefix
_HEADER = struct.Struct("100s8s8s8s12s12s8sc100s72x8s8s155s12x")
_META_TYPES = frozenset((tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE))
MAX_META_BYTES = 1 << 20  # a long name or a pax header, which tarfile reads whole: real ones hold a few hundred bytes


class Unsupported(Exception):
    """A header this walker does not read exactly as ``tarfile`` would: read the archive with ``tarfile``."""


class UnsafeHeader(tarfile.TarError):
    """A header ``tarfile`` would loop on or read without bound; names the member."""


class CheckedTarInfo(tarfile.TarInfo):
    """``tarfile``'s member, refused (``UnsafeHeader``) where its header has a negative size, where the next
    header would not lie past this one, where it is a long name or pax header over ``MAX_META_BYTES``, or where
    ``tarfile`` fails on it with another error than its own (a pax sparse map that is not numbers)."""

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> "CheckedTarInfo":
        info = super().frombuf(buf, encoding, errors)
        if info.size < 0:
            raise UnsafeHeader(f"member {info.name} has a negative size ({info.size})")
        if info.type in _META_TYPES and info.size > MAX_META_BYTES:
            raise UnsafeHeader(f"member {info.name} has a {info.size:,}-byte extended header; real ones hold a few hundred bytes")
        return info

    @classmethod
    def fromtarfile(cls, archive: tarfile.TarFile) -> "CheckedTarInfo":
        try:
            info = super().fromtarfile(archive)
        except OSError:
            raise
        except (ValueError, IndexError) as e:  # tarfile reads a damaged pax or sparse header's numbers with int()
            raise UnsafeHeader(f"unreadable pax or sparse header at byte {archive.offset} ({e})") from None
        if info.size < 0 or archive.offset <= info.offset:  # a pax "size" is applied after frombuf
            raise UnsafeHeader(f"member {info.name} has a size ({info.size}) that does not move the next header forward")
        return info


def open_tarfile(fileobj: IO[bytes]) -> tarfile.TarFile:
    """``tarfile`` reading the tar in ``fileobj`` from where it stands, its headers checked by ``CheckedTarInfo``."""
    return tarfile.TarFile(fileobj=fileobj, mode="r", tarinfo=CheckedTarInfo)


class TarEntry(NamedTuple):
    """One tar member as listed: its name, where its data lies, its type and link target."""

    name: str
    offset: int
    size: int
    type: bytes  # tarfile.REGTYPE, LNKTYPE, SYMTYPE, DIRTYPE, ...
    linkname: str = ""


class TarWalk:
    """The members of one tar, front to back, from ``read(n)`` (the next ``n`` bytes, fewer at the end)
    and ``skip(n)`` (pass over ``n``). A member's data may be read with ``data`` before the walk moves
    on. Once every member is out, ``end`` is the offset of the end-of-archive block (``tarfile``'s
    ``offset`` after its last member); ``offset`` of a member is that of its data."""

    def __init__(self, read: Callable[[int], bytes], skip: Callable[[int], object]) -> None:
        self.read, self.skip = read, skip
        self.end = 0
        self._taken = 0

    def __iter__(self) -> Iterator[TarEntry]:
        offset = 0
        while True:
            header = self.read(BLOCK)
            if header == _ZERO_BLOCK:
                self.end = offset
                return
            member = parse(header, offset)
            self._taken = 0
            yield member
            offset += BLOCK
            if member.type in tarfile.REGULAR_TYPES:  # tarfile passes over the data of these only
                blocks = -(-member.size // BLOCK) * BLOCK
                self.skip(blocks - self._taken)
                offset += blocks

    def data(self, member: TarEntry) -> bytes:
        """The data of ``member``, the one just yielded (fewer bytes where the archive ends early)."""
        data = self.read(member.size)
        self._taken = len(data)
        return data


class TarfileWalk:
    """The same walk by ``tarfile`` itself, over a file object: every kind of header, ``tarfile``'s errors.
    A member with sparse data is given the type ``GNUTYPE_SPARSE``."""

    def __init__(self, fileobj: IO[bytes]) -> None:
        self.fileobj = fileobj
        self.end = 0
        self._archive: tarfile.TarFile | None = None
        self._info: tarfile.TarInfo | None = None

    def __iter__(self) -> Iterator[TarEntry]:
        with open_tarfile(self.fileobj) as archive:
            self._archive = archive
            while (info := archive.next()) is not None:
                self._info = info
                kind = tarfile.GNUTYPE_SPARSE if info.isreg() and info.sparse is not None else info.type
                yield TarEntry(info.name, info.offset_data, info.size, kind, info.linkname)
                archive.members.clear()  # memory stays flat: the caller keeps what it needs
            self.end = archive.offset

    def data(self, member: TarEntry) -> bytes:
        """The data of ``member``, the one just yielded."""
        return self._archive.extractfile(self._info).read()  # type: ignore[union-attr]


def walk_file(fileobj: IO[bytes], plain: bool) -> TarWalk | TarfileWalk:
    """The members of the tar in ``fileobj``, from where it stands: walked by ``TarWalk`` where every
    header is ``plain``, else by ``tarfile``."""
    if plain:
        return TarWalk(fileobj.read, lambda count: fileobj.seek(count, io.SEEK_CUR))
    return TarfileWalk(fileobj)


def parse(header: bytes, offset: int) -> TarEntry:
    """The member a plain header at ``offset`` describes, as ``tarfile.TarInfo.frombuf`` reads it; else ``Unsupported``."""
    if len(header) != BLOCK:
        raise Unsupported("a short header")
    name, mode, uid, gid, size, mtime, checksum, kind, linkname, devmajor, devminor, prefix = _HEADER.unpack(header)
    if kind not in _PLAIN_TYPES:
        raise Unsupported(f"a header of type {kind!r}")
    if not all(map(_plain_octal, (mode, uid, gid, size, mtime, checksum, devmajor, devminor))):
        raise Unsupported("a number field that is not plain octal")
    if _octal(checksum) != 256 + sum(header) - sum(checksum):
        raise Unsupported("a checksum that is not the unsigned one")
    text = _text(name)
    if kind == tarfile.AREGTYPE and text.endswith("/"):
        kind = tarfile.DIRTYPE  # old V7 tars mark a folder so
    if kind == tarfile.DIRTYPE:
        text = text.rstrip("/")
    if prefix[0]:
        text = _text(prefix) + "/" + text
        if kind == tarfile.DIRTYPE:
            text = text.rstrip("/")
    return TarEntry(text, offset + BLOCK, _octal(size), kind, _text(linkname) if linkname[0] else "")


@functools.lru_cache(maxsize=4096)  # the fields repeat from member to member (modes, owners, times)
def _plain_octal(field: bytes) -> bool:
    """True when ``tarfile`` reads the number field as the octal digits it holds (else it may read it otherwise, or refuse it)."""
    return _OCTAL.fullmatch(field) is not None


def _text(field: bytes) -> str:
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode(tarfile.ENCODING, "surrogateescape")


def _octal(field: bytes) -> int:
    end = field.find(b"\0")
    return int((field if end < 0 else field[:end]).strip() or b"0", 8)
