"""Real file-system conditions for tests: a small or read-only tmpfs, and a command that meets file permissions.

Tests run as root here, where ``chmod 000`` denies nothing and no disk is ever full. So:
``tmpfs`` mounts a real tmpfs of a given size (or read-only) inside the test's folder, which
gives real ENOSPC and EROFS errors (root only: the test is skipped otherwise), and
``as_plain_user`` drops root's two capabilities that override file permissions from a
subprocess, so that it is refused a ``chmod 000`` file as any user is.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

PAGE = 4096  # tmpfs counts its size in pages
_PR_CAPBSET_DROP = 24  # <linux/prctl.h>
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2  # <linux/capability.h>


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "2m") mounted at ``path`` for the block, then unmounted."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = (
        os.geteuid() == 0
        and subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0
    )
    if not mounted:
        pytest.skip("a real full or read-only file system needs root to mount a tmpfs")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path, leave_pages: int = 0) -> Path:
    """Fill the file system of ``folder`` with one file up to ENOSPC, then give ``leave_pages`` pages back; return the file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while True:
            try:
                os.write(fd, b"\0" * PAGE)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave_pages * PAGE))
    finally:
        os.close(fd)
    return filler


def as_plain_user() -> None:
    """``preexec_fn``: remove CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set, so the
    command run next (uid 0 or not) gets neither and file permissions apply to it."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
