"""Checksums: the records' crc32, and the sha256 of a file, read from the disk.

``crc32`` is the ``{split}.crc32.npy`` sidecar's (zlib's CRC-32), computed by ISA-L when python-isal is
installed (the ``fast`` extra): pack takes one per record written; a read from a URL, the node cache's
fill and ``verify`` one per record read. ``sha256_file`` and ``hash_range`` hash what a file holds, in
bounded blocks, for the manifest; ``hashed_blocks`` hands a file's blocks on as it hashes them.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, BinaryIO, Iterator

try:
    from isal.isal_zlib import crc32
except ImportError:
    from zlib import crc32

__all__ = ["crc32", "sha256_file", "hash_range", "hashed_blocks", "HASH_BLOCK_BYTES"]

HASH_BLOCK_BYTES = 4 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for _ in hashed_blocks(f, HASH_BLOCK_BYTES, digest):
            pass
    return digest.hexdigest()


def hash_range(fd: int, start: int, end: int, digest: Any) -> int:
    """Add bytes ``[start, end)`` of the open file ``fd`` to ``digest``; return where they ended
    (``end``, or the end of a file shorter than that)."""
    at = start
    while at < end:
        block = os.pread(fd, min(HASH_BLOCK_BYTES, end - at), at)
        if not block:
            break
        digest.update(block)
        at += len(block)
    return at


def hashed_blocks(f: BinaryIO, block: int, digest: Any) -> Iterator[bytes]:
    """The blocks of ``f`` from where it stands to its end, each added to ``digest`` before it is handed on."""
    while data := f.read(block):
        digest.update(data)
        yield data
