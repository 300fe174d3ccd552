"""A local (or mounted) folder as a ``ByteSource``: ``pread``, with files opened lazily in each process."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from imgpipe._sys.forks import reset_after_fork
from imgpipe._sys.regular import read_regular
from imgpipe._sys.writes import write_at
from imgpipe.errors import DatasetError, ImgpipeError
from imgpipe.storage.source import COPY_BLOCK_BYTES, ByteRange, ByteSource, RangeCheck, RangeError


class LocalSource(ByteSource):
    """A local or mounted folder (or, with ``root=None``, files named by their paths): ``pread`` on
    descriptors opened lazily in each process, dropped in a forked child (``_sys.forks``), never pickled."""

    def __init__(self, root: str | os.PathLike | None) -> None:
        self.root = None if root is None else Path(root)
        self.location = "" if root is None else str(root)
        self._fds: dict[str, int] = {}
        reset_after_fork(self, LocalSource._forget_parent)

    def path(self, name: str) -> Path:
        return Path(name) if self.root is None else self.root / name

    def where(self, name: str) -> str:
        return str(self.path(name))

    def read_file(self, name: str) -> bytes:
        return read_regular(self.path(name))

    def size(self, name: str) -> int:
        return self.path(name).stat().st_size

    def read_range(self, name: str, start: int, end: int) -> bytes:
        return os.pread(self._fd(name), end - start, start)

    def read_ranges(self, ranges: Sequence[ByteRange], check: RangeCheck | None = None) -> list[memoryview | ImgpipeError]:
        out: list[memoryview | ImgpipeError] = []
        for k, (name, start, end) in enumerate(ranges):
            try:
                data = memoryview(self.read_range(name, start, end))
            except (OSError, DatasetError) as e:
                out.append(RangeError(self.where(name), start, str(e)))
                continue
            reason = f"short read: {len(data)} of {end - start} bytes" if len(data) != end - start else check(k, data) if check else None
            out.append(data if reason is None else RangeError(self.where(name), start, reason))
        return out

    def download(self, name: str, dest: str | os.PathLike) -> int:
        shutil.copyfile(self.path(name), dest)
        return os.path.getsize(dest)

    def download_range(self, name: str, dest: str | os.PathLike, start: int, end: int) -> int:
        with open(self.path(name), "rb") as src, open(dest, "r+b") as out:
            at = start
            while at < end:
                block = os.pread(src.fileno(), min(COPY_BLOCK_BYTES, end - at), at)
                if not block:
                    raise DatasetError(f"{self.path(name)}: ends at {at} bytes, {end} expected (it changed while being copied?)")
                write_at(out.fileno(), block, at)
                at += len(block)
        return end - start

    def list_names(self) -> list[str] | None:
        if self.root is None:
            return None
        return sorted(p.name for p in self.root.iterdir() if p.is_file())

    def list_sizes(self) -> dict[str, int] | None:
        if self.root is None:
            return None
        return {e.name: e.stat().st_size for e in os.scandir(self.root) if e.is_file()}

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            try:
                fd = os.open(self.path(name), os.O_RDONLY)
            except OSError as e:
                raise DatasetError(f"{self.path(name)}: cannot open ({e.strerror})") from None
            self._fds[name] = fd
        return fd

    def _forget_parent(self) -> None:
        """In a forked child: close its copies of the parent's descriptors (they share the parent's file offsets)."""
        self.close()

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fds"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        reset_after_fork(self, LocalSource._forget_parent)
