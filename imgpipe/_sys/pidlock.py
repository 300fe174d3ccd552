"""Lock files: ``flock`` on a file (``lock_file``, ``locked``), and a lock file that says who holds it.

The kernel drops an ``flock`` when every descriptor of it closes, so a holder killed with
``kill -9`` frees the lock by itself (unless a child it forked still holds the descriptor:
the callers decide how long to wait for that). ``try_lock`` writes the holder's pid and host
inside, so that a process that finds the lock taken can say who holds it and whether that
process still runs. Not the ``filelock`` library: its lock is exclusive only (the node cache's
leases are shared), and its at-fork hook closes the lock in every forked child, so a killed pack's
workers would leave DST unlocked while they may still write there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path
from typing import Iterator


def lock_file(path: str | os.PathLike, *, shared: bool = False, wait: bool = True, flags: int = os.O_RDWR, mode: int = 0o644) -> int | None:
    """A descriptor of ``path`` (created if need be) that holds its ``flock``, exclusive or ``shared``;
    None when ``wait`` is False and another process holds it. Closing the descriptor lets go."""
    fd = os.open(path, flags | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def locked(path: str | os.PathLike, *, flags: int = os.O_RDWR, mode: int = 0o644) -> Iterator[None]:
    """Hold the exclusive lock of ``path`` for a ``with`` block (waiting for it)."""
    fd = lock_file(path, flags=flags, mode=mode)
    assert fd is not None  # a waiting lock is always taken
    try:
        yield
    finally:
        os.close(fd)


def try_lock(path: str | os.PathLike) -> int | None:
    """Take the lock at ``path`` (created if need be) and write our pid and host into it: the
    descriptor to keep open while holding it, or None when another process holds it."""
    fd = lock_file(path, wait=False)
    if fd is None:
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return fd


def is_held(path: str | os.PathLike) -> bool:
    """Whether a process holds the lock at ``path`` now (looked at without writing into it)."""
    if not os.path.exists(path):
        return False
    fd = lock_file(path, wait=False, flags=os.O_RDONLY)
    if fd is None:
        return True
    os.close(fd)  # closing lets go of the lock it took
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
