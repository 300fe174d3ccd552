"""Pack reads regular files only. A link, a device, a FIFO or a socket named like an image, in a folder or
inside an archive, is never opened: it is listed as skipped with the reason these functions give.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile

from imgpipe._sys.regular import file_kind
from imgpipe.ingest.tarwalk import TarEntry

_TAR_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
}


def not_regular(kind: str, target: str = "") -> str:
    """The reason a pack gives for skipping ``kind`` (``target``: where a link leads)."""
    link = f" to {target!r}" if target else ""
    return f"not a regular file ({kind}{link}); only regular files are packed"


def mode_reason(mode: int) -> str | None:
    """Why a file of this ``st_mode`` is not read, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return not_regular(file_kind(mode))


def tar_reason(member: TarEntry) -> str | None:
    """Why the tar member is not read, or None for a regular file."""
    if member.type in tarfile.REGULAR_TYPES:
        return None
    return not_regular(_TAR_KINDS.get(member.type, f"tar type {member.type.decode('latin-1')!r}"), member.linkname)


def zip_reason(info: zipfile.ZipInfo) -> str | None:
    """Why the zip member is not read, or None for a file: a zip that records no Unix file type (made on Windows) holds files."""
    mode = info.external_attr >> 16
    return None if stat.S_IFMT(mode) == 0 else mode_reason(mode)
