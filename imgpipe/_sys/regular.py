"""Opening a file imgpipe wrote, to read it back: only a regular file is read.

A FIFO put where a journal entry, a manifest or a sidecar belongs would block its reader forever, and a
link to ``/dev/zero`` would feed it until memory runs out: the file is opened without blocking and
checked with ``fstat`` first, so anything but a regular file is an ``OSError`` that names what it is.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a folder"),
)


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a FIFO", "a character device", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((kind for test, kind in _KINDS if test(mode)), f"a file of type {stat.S_IFMT(mode):#o}")


class NotRegularFile(OSError):
    """The path is a FIFO, a device or a socket (a folder is an ``IsADirectoryError``, as ``open`` says)."""

    def __str__(self) -> str:
        return f"{self.strerror}: {self.filename!r}"  # no errno to show


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """The regular file at ``path`` opened for reading; ``NotRegularFile`` or ``IsADirectoryError`` for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if not stat.S_ISREG(mode):
            raise NotRegularFile(None, f"not a regular file but {file_kind(mode)}", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file at ``path`` (see ``open_regular``)."""
    with open_regular(path) as f:
        return f.read()
