"""Read source files in a given order, with many reads in flight, as the storage they are on wants it.

On a local file system one thread opens the next files (up to ``ADVISED_AHEAD``, ``ADVISED_BYTES`` at
most) and asks the kernel to read them (``posix_fadvise(WILLNEED)``), so the disk's queue holds
neighbours to merge; on a network or FUSE file system, where an open is a round trip, ``READ_THREADS``
threads each open and read a file. A file with no planned bytes (empty, vanished, a FIFO) is opened
only at its turn, so that a FIFO blocks nothing but its own read.
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

ADVISED_AHEAD = 64
ADVISED_BYTES = 64 << 20
READ_THREADS = 16
READ_CHUNK = 1 << 20


def opens_are_round_trips(root: Path) -> bool:
    """Whether files under ``root`` are on a network or FUSE file system: each open a round trip, best made by threads."""
    info = device_for_path(root)
    return info.network or info.fstype == "fuse" or info.fstype.startswith("fuse.")


def _reason(error: OSError) -> str:
    return f"unreadable ({error.strerror or type(error).__name__})"


def read_file(path: str) -> bytes | str:
    """The file's bytes, or the reason it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return _reason(e)


def _read_open(fd: int, size: int) -> bytes | str:
    """What is left to read of the open file ``fd`` (``size`` bytes planned), to its end; or why it cannot be read."""
    try:
        chunks = [os.read(fd, size + 1)]
        while chunks[-1]:  # a file that grew since the scan is read to its end, as read_file reads it
            chunks.append(os.read(fd, READ_CHUNK))
    except OSError as e:
        return _reason(e)
    return chunks[0] if len(chunks) == 2 else b"".join(chunks)


def _open_advised(path: str) -> int | str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        return _reason(e)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:  # a file system that takes no advice reads it when asked
        pass
    return fd


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
        window: deque[int | str | None] = deque()  # the next files' fds, or why one has none (None: opened at its turn)
        ahead = bytes_ahead = 0
        try:
            for k, path in enumerate(self.paths):
                while ahead < len(self.paths) and (not window or (len(window) < ADVISED_AHEAD and bytes_ahead < ADVISED_BYTES)):
                    window.append(_open_advised(self.root + self.paths[ahead]) if sizes[ahead] > 0 else None)
                    bytes_ahead += max(sizes[ahead], 0)
                    ahead += 1
                handle = window.popleft()
                bytes_ahead -= max(sizes[k], 0)
                if handle is None:
                    yield read_file(self.root + path)
                elif isinstance(handle, str):
                    yield handle
                else:
                    try:
                        data = _read_open(handle, sizes[k])
                    finally:
                        os.close(handle)
                    yield data
        finally:
            for handle in window:
                if isinstance(handle, int):
                    os.close(handle)

    def _by_threads(self) -> Iterator[bytes | str]:
        if len(self.paths) == 1:
            yield read_file(self.root + self.paths[0])
            return
        pool = DaemonPool(READ_THREADS, "imgpipe-pack-read")
        queued = iter(self.paths)
        window = deque(pool.submit(read_file, self.root + path) for path in itertools.islice(queued, READ_THREADS))
        try:
            while window:
                data = window.popleft().result()
                following = next(queued, None)
                if following is not None:
                    window.append(pool.submit(read_file, self.root + following))
                yield data
        finally:
            pool.close()
