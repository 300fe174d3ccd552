"""One wording for the OS errors a user can act on (a full disk, a read-only file system, a permission), and what to do.

``Permission denied`` for a read-only file system, or a download advice for a file the user
may not read, sends people the wrong way: the errno decides the advice.
"""

from __future__ import annotations

import errno
import os
import tempfile

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
NO_ACCESS = frozenset({errno.EACCES, errno.EPERM})


def reason(error: OSError) -> str:
    """``No space left on device (ENOSPC)``: the OS's words and the errno's name."""
    name = errno.errorcode.get(error.errno or 0)
    text = error.strerror or type(error).__name__
    return f"{text} ({name})" if name else text


def advice(error: OSError, *, writing: bool) -> str:
    """What to do about ``error`` met while reading or writing a path; empty when the errno says nothing useful."""
    if error.errno in NO_SPACE:
        return "free space there (or raise the quota or file-size limit)"
    if error.errno == errno.EROFS:
        return "the file system is mounted read-only: remount it read-write"
    if error.errno in NO_ACCESS:
        return f"give the user running imgpipe {'write' if writing else 'read'} access to it (see ls -l; chmod or chown)"
    if error.errno == errno.EISDIR:
        return "a folder is in the way: move it away"
    if error.errno == errno.EIO:
        return "the device reported an I/O error: check the disk or the network mount (dmesg)"
    return ""


def describe(error: OSError, *, writing: bool) -> str:
    """``reason; advice`` in one phrase."""
    fix = advice(error, writing=writing)
    return f"{reason(error)}; {fix}" if fix else reason(error)


def write_probe(folder: str | os.PathLike) -> OSError | None:
    """Why no file can be made in ``folder`` (an attempt, not ``os.access``, so a read-only file system is named as such), or None."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return e
    return None
