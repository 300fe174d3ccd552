"""A read-only FUSE passthrough that waits ``DELAY_MS`` on every open: storage where each file costs a round trip,
as on NFS or a cloud volume. Run by ``pack_storage.py latency`` with the interpreter of a venv holding fusepy
(``pip install fusepy``; libfuse2 from the system, e.g. ``apt-get install libfuse2 fuse``):

    python _delayfs.py ROOT MOUNTPOINT DELAY_MS
"""

from __future__ import annotations

import errno
import os
import sys
import time

from fuse import FUSE, FuseOSError, Operations  # type: ignore[import-not-found]


class DelayedOpens(Operations):  # type: ignore[misc]
    def __init__(self, root: str, delay_s: float) -> None:
        self.root, self.delay_s = root, delay_s

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path: str, fh: int | None = None) -> dict:
        try:
            st = os.lstat(self._path(path))
        except OSError as e:
            raise FuseOSError(e.errno) from None
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime", "st_ino")
        return {key: getattr(st, key) for key in keys}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._path(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._path(path))

    def statfs(self, path: str) -> dict:
        st = os.statvfs(self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {key: getattr(st, key) for key in keys}

    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        time.sleep(self.delay_s)  # the round trip
        return os.open(self._path(path), flags)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0


if __name__ == "__main__":
    root, mountpoint, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    FUSE(DelayedOpens(root, delay_ms / 1000), mountpoint, foreground=True, ro=True, nothreads=False, subtype="delayfs")
