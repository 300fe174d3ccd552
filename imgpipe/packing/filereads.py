"""Read source files in a given order, with many reads in flight, as the storage they are on wants it.

On a local file system one thread opens the next files (up to ``ADVISED_AHEAD``, ``ADVISED_BYTES`` at
most) and asks the kernel to read them (``posix_fadvise(WILLNEED)``), so the disk's queue holds
neighbours to merge; on a network or FUSE file system, where an open is a round trip, ``READ_THREADS``
threads each open and read a file. Only a regular file of the planned size is read, and only its planned
bytes: anything else put there since the plan (a FIFO, a device, a file that changed) gives its reason.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from imgpipe._sys.diskinfo import device_for_path
from imgpipe._sys.threads import DaemonPool
from imgpipe.ingest.filekinds import mode_reason

ADVISED_AHEAD = 64
ADVISED_BYTES = 64 << 20
READ_THREADS = 16


def opens_are_round_trips(root: Path) -> bool:
    """Whether files under ``root`` are on a network or FUSE file system: each open a round trip, best made by threads."""
    info = device_for_path(root)
    return info.network or info.fstype == "fuse" or info.fstype.startswith("fuse.")


def _reason(error: OSError) -> str:
    return f"unreadable ({error.strerror or type(error).__name__})"


def open_planned(path: str, size: int) -> int | str:
    """The open regular file ``path`` of ``size`` bytes, as the plan found it; else why it is not read.

    Opened without blocking (a FIFO put there since the plan opens at once) and checked with ``fstat``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return _reason(e)
    try:
        info = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        return _reason(e)
    reason = mode_reason(info.st_mode)
    if reason is None and info.st_size != size:
        reason = f"changed since the pack was planned ({size:,} bytes then, {info.st_size:,} now); rerun with --overwrite to pack it"
    if reason is not None:
        os.close(fd)
        return reason
    return fd


def _read_open(fd: int, size: int) -> bytes | str:
    """The first ``size`` bytes of the open file ``fd`` (fewer where it ends first), or why it cannot be read; closes ``fd``."""
    chunks: list[bytes] = []
    left = size
    try:
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        return _reason(e)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_file(path: str, size: int) -> bytes | str:
    """The regular file's ``size`` planned bytes, or the reason it is not read."""
    handle = open_planned(path, size)
    return handle if isinstance(handle, str) else _read_open(handle, size)


def _advise(handle: int | str) -> int | str:
    if isinstance(handle, int):
        try:
            os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:  # a file system that takes no advice reads it when asked
            pass
    return handle


@dataclass(frozen=True)
class FileReads:
    """Files under ``root`` (which ends with a separator) with their planned sizes, read in this order."""

    root: str
    paths: list[str]
    sizes: np.ndarray
    threads: bool  # read by READ_THREADS threads (network, FUSE), else opened and advised ahead

    def read(self) -> Iterator[bytes | str]:
        """Each file's bytes, or the reason it has none, in order."""
        return self._by_threads() if self.threads else self._advised()

    def _advised(self) -> Iterator[bytes | str]:
        sizes = self.sizes.tolist()
        window: deque[int | str] = deque()  # the next files' fds, or why one is not read
        ahead = bytes_ahead = 0
        try:
            for k in range(len(self.paths)):
                while ahead < len(self.paths) and (not window or (len(window) < ADVISED_AHEAD and bytes_ahead < ADVISED_BYTES)):
                    window.append(_advise(open_planned(self.root + self.paths[ahead], sizes[ahead])))
                    bytes_ahead += sizes[ahead]
                    ahead += 1
                handle = window.popleft()
                bytes_ahead -= sizes[k]
                yield handle if isinstance(handle, str) else _read_open(handle, sizes[k])
        finally:
            for handle in window:
                if isinstance(handle, int):
                    os.close(handle)

    def _by_threads(self) -> Iterator[bytes | str]:
        sizes = self.sizes.tolist()
        if len(self.paths) == 1:
            yield read_file(self.root + self.paths[0], sizes[0])
            return
        pool = DaemonPool(READ_THREADS, "imgpipe-pack-read")
        queued = iter(zip(self.paths, sizes))
        window = deque(pool.submit(read_file, self.root + path, size) for path, size in itertools.islice(queued, READ_THREADS))
        try:
            while window:
                data = window.popleft().result()
                following = next(queued, None)
                if following is not None:
                    window.append(pool.submit(read_file, self.root + following[0], following[1]))
                yield data
        finally:
            pool.close()
