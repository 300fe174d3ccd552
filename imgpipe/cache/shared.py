"""A small array in a file that every process of a node maps (``MAP_SHARED``): a store is seen by the others at once."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np


class SharedArray:
    """``size`` items of ``dtype`` in the file ``path``, zeros until stored. ``allocate`` gives the file its
    blocks up front (a store into a mapped page the disk has no room for would be a SIGBUS, not an
    error); each process maps it on first use, and it pickles without the mapping."""

    def __init__(self, path: Path, size: int, dtype: type = np.uint8) -> None:
        self.path = path
        self.size = size
        self.dtype = np.dtype(dtype)
        self._array: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def allocate(self) -> None:
        """Make the file its full size with its blocks allocated (never shrinks it); ``OSError`` on a full disk."""
        if self.nbytes == 0:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < self.nbytes or os.fstat(fd).st_blocks * 512 < self.nbytes:
                os.posix_fallocate(fd, 0, self.nbytes)
        finally:
            os.close(fd)

    @property
    def array(self) -> np.ndarray:
        """A writable array over the shared mapping (a forked child keeps its parent's: it is shared)."""
        if self._array is None:
            self._array = self._map()
        return self._array

    def _map(self) -> np.ndarray:
        if self.nbytes == 0:
            return np.zeros(0, self.dtype)
        self.allocate()
        fd = os.open(self.path, os.O_RDWR)
        try:
            mapping = mmap.mmap(fd, self.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return np.frombuffer(mapping, self.dtype)

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "dtype": self.dtype, "_array": None}
