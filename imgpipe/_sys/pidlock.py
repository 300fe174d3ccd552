"""A lock file that says who holds it: ``flock`` on the file, the holder's pid and host written inside.

The kernel drops an ``flock`` when every descriptor of it closes, so a holder killed with
``kill -9`` frees the lock by itself (unless a child it forked still holds the descriptor:
the callers decide how long to wait for that). The pid and host inside let a process that
finds the lock taken say who holds it and whether that process still runs.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path


def try_lock(path: str | os.PathLike) -> int | None:
    """Take the lock at ``path`` (created if need be) and write our pid and host into it: the
    descriptor to keep open while holding it, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return fd


def is_held(path: str | os.PathLike) -> bool:
    """Whether a process holds the lock at ``path`` now (looked at without writing into it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets go of a lock it took
    return False


def release(fd: int) -> None:
    """Give the lock up (closing its descriptor)."""
    os.close(fd)


def lock_holder(path: str | os.PathLike) -> tuple[int, str] | None:
    """(pid, host) written by the process that holds (or last held) the lock, if it wrote them yet."""
    try:
        pid, host = Path(path).read_text(encoding="utf-8").split()
        return int(pid), host
    except (OSError, ValueError):
        return None


def holder_alive(pid: int, host: str) -> bool:
    """Whether that process still runs; one on another machine counts as running."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_holder(holder: tuple[int, str] | None) -> str:
    """``pid 123``, ``pid 123 on node7``, or ``pid unknown``."""
    if holder is None:
        return "pid unknown"
    return f"pid {holder[0]}" + ("" if holder[1] == socket.gethostname() else f" on {holder[1]}")
