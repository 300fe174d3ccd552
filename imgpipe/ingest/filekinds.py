"""Pack reads regular files only. A link, a device, a FIFO or a socket named like an image, in a folder or
inside an archive, is never opened: it is listed as skipped with the reason these functions give. One
named like a layout's archive (a tar, a zip, a Parquet file, a shard) or its label file is one line.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path

from imgpipe._sys.oserrors import reason
from imgpipe._sys.regular import file_kind
from imgpipe.errors import DatasetError
from imgpipe.ingest.tarwalk import TarEntry

_TAR_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
}
_FIX = "put the file itself there, or move it out of SRC"


def not_regular(kind: str, target: str = "") -> str:
    """The reason a pack gives for skipping ``kind`` (``target``: where a link leads)."""
    link = f" to {target!r}" if target else ""
    return f"not a regular file ({kind}{link}); only regular files are packed"


def is_folder(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a folder or a link to one; a link that cannot be followed (a loop: ELOOP) is not."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def mode_reason(mode: int) -> str | None:
    """Why a file of this ``st_mode`` is not read, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return not_regular(file_kind(mode))


def is_source_file(path: Path) -> bool:
    """True for a regular file (or a link to one), False where nothing (or a folder) is: how a layout finds its archives
    and label files by name. Anything else by that name (a device, a FIFO, a socket, a link to one or to nothing) is a
    DatasetError naming it, not a file passed over without a word."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not os.path.islink(path):
            return False
        raise DatasetError(f"{path}: a symbolic link to {os.readlink(path)!r}, which does not exist; {_FIX}") from None
    except OSError as e:
        raise DatasetError(f"{path}: unreadable ({reason(e)}); {_FIX}") from None
    if stat.S_ISDIR(mode):
        return False
    why = mode_reason(mode)
    if why is not None:
        raise DatasetError(f"{path}: {why}; {_FIX}")
    return True


def tar_reason(member: TarEntry) -> str | None:
    """Why the tar member is not read, or None for a regular file."""
    if member.type in tarfile.REGULAR_TYPES:
        return None
    return not_regular(_TAR_KINDS.get(member.type, f"tar type {member.type.decode('latin-1')!r}"), member.linkname)


def zip_reason(info: zipfile.ZipInfo) -> str | None:
    """Why the zip member is not read, or None for a file: a zip that records no Unix file type (made on Windows) holds files."""
    mode = info.external_attr >> 16
    return None if stat.S_IFMT(mode) == 0 else mode_reason(mode)
