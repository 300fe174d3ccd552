"""Page-cache residency of files (``mincore``) and eviction (``posix_fadvise(DONTNEED)``).

Residency maps each file read-only with libc's ``mmap`` and asks ``mincore`` which pages
are in RAM; nothing is read, so measuring does not warm the cache. Where mincore is not
available the fraction is ``None`` ("unknown").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Iterable

logger = logging.getLogger(__name__)

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def resident_pages(path: str | os.PathLike) -> tuple[int, int] | None:
    """(pages in the page cache, pages in the file) for one file, or None if unknown."""
    if _LIBC is None:
        return None
    size = os.path.getsize(path)
    total = (size + PAGE_SIZE - 1) // PAGE_SIZE
    if size == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _LIBC.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            return None
        try:
            vec = (ctypes.c_ubyte * total)()
            if _LIBC.mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in bytes(vec)), total
        finally:
            _LIBC.munmap(addr, size)
    finally:
        os.close(fd)


def resident_fraction(paths: Iterable[str | os.PathLike]) -> float | None:
    """Fraction of the files' pages that are in RAM (0..1), or None where mincore is unavailable."""
    resident = total = 0
    for path in paths:
        counts = resident_pages(path)
        if counts is None:
            return None
        resident += counts[0]
        total += counts[1]
    return resident / total if total else None


def evict(paths: Iterable[str | os.PathLike]) -> int:
    """Drop the files' clean pages from the page cache; return the number of files evicted.

    Dirty pages cannot be dropped, so each file is flushed to disk first.
    """
    count = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    logger.debug("evicted %d files from the page cache", count)
    return count
