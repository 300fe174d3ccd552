"""Positional writes whose length is checked: a write the disk takes only in part is never taken for whole."""

from __future__ import annotations

import errno
import os
from typing import Any


def write_at(fd: int, data: Any, offset: int) -> None:
    """Write all of ``data`` (bytes or a buffer) at ``offset`` of ``fd``. ``pwrite`` may take fewer
    bytes than it was given (a disk filling up): the rest is written again, and a write that takes
    nothing raises ``OSError(ENOSPC)``, as a full disk's next write does."""
    view = memoryview(data).cast("B")
    while view:
        done = os.pwrite(fd, view, offset)
        if done <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[done:], offset + done
