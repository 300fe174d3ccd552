"""Where a packed folder's bytes come from: a local (or mounted) folder, or a URL.

A ``ByteSource`` serves the files of one folder by name (whole small files, sizes, a file copied to a
local path, batches of ``(file, start, end)`` ranges) and knows nothing of records: which bytes a record
is stays the ShardSet's index. ``storage.opening.open_source`` picks ``local.LocalSource`` or
``objectstore.ObjectStoreSource``; ``imgpipe.cache.source.CacheSource`` puts a node cache in front of a
URL. A range that fails the caller's ``check(k, bytes)`` is an error item of the result, never raised.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import Future
from typing import Any, Callable, NamedTuple, Sequence

from imgpipe.errors import ImgpipeError, RemoteError

URL_SCHEMES = ("s3", "s3a", "gs", "az", "azure", "adl", "abfs", "abfss", "http", "https")
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")

COPY_BLOCK_BYTES = 4 << 20  # a local range is copied in blocks of this size

RangeCheck = Callable[[int, memoryview], "str | None"]  # (position in the batch, bytes) -> why they are wrong, or None


class ByteRange(NamedTuple):
    """Bytes ``[start, end)`` of file ``name`` of a source."""

    name: str
    start: int
    end: int


class RangeError(RemoteError):
    """A range that could not be read as asked; ``reason`` says why, without the location."""

    def __init__(self, where: str, start: int, reason: str) -> None:
        super().__init__(f"{where}: offset {start}: {reason}")
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return _range_error, (str(self), self.reason)


def _range_error(message: str, reason: str) -> RangeError:
    error = RangeError.__new__(RangeError)
    Exception.__init__(error, message)
    error.reason = reason
    return error


def url_scheme(location: object) -> str | None:
    """The scheme of a URL (``s3``, ``https``, ...), or None for a local path."""
    if not isinstance(location, str):
        return None
    match = _SCHEME.match(location)
    return match["scheme"].lower() if match else None


def is_url(location: object) -> bool:
    """True for ``scheme://...`` (a location ``open_source`` reads remotely), False for a path."""
    return url_scheme(location) is not None


class ByteSource:
    """The files of one folder, by name. Subclasses: ``LocalSource``, ``ObjectStoreSource``."""

    location: str  # the folder, as messages show it
    remote: bool = False

    def where(self, name: str) -> str:
        """File ``name`` as messages show it: a path or a URL."""
        raise NotImplementedError

    def read_file(self, name: str) -> bytes:
        """The whole file; ``FileNotFoundError`` when it does not exist."""
        raise NotImplementedError

    def read_files(self, names: Sequence[str]) -> list[bytes]:
        """Several whole files (a remote source fetches them concurrently)."""
        return [self.read_file(name) for name in names]

    def size(self, name: str) -> int:
        """The file's size in bytes; ``FileNotFoundError`` when it does not exist."""
        raise NotImplementedError

    def read_range(self, name: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of one file (fewer at its end); its error raised."""
        (result,) = self.read_ranges([ByteRange(name, start, end)])
        if isinstance(result, ImgpipeError):
            raise result
        return result

    def read_ranges(self, ranges: Sequence[ByteRange], check: RangeCheck | None = None) -> list[memoryview | ImgpipeError]:
        """Each range's bytes, in order, or the error that stopped it (an item, not raised)."""
        raise NotImplementedError

    def submit_ranges(self, ranges: Sequence[ByteRange], check: RangeCheck | None = None) -> Future[list[memoryview | ImgpipeError]]:
        """``read_ranges`` started now; the Future holds its result (read at once by a local source)."""
        future: Future[list[memoryview | ImgpipeError]] = Future()
        future.set_result(self.read_ranges(ranges, check))
        return future

    def download(self, name: str, dest: str | os.PathLike) -> int:
        """Copy file ``name`` to the local path ``dest`` (overwritten); return its size."""
        raise NotImplementedError

    def download_range(self, name: str, dest: str | os.PathLike, start: int, end: int) -> int:
        """Copy bytes ``[start, end)`` of file ``name`` to the same offset of the existing local file
        ``dest`` (so that several ranges of one file can be copied at once); return their count."""
        raise NotImplementedError

    def request_stats(self) -> dict[str, float] | None:
        """What this process's range reads from the store cost so far (see ``store_client``); None for a local folder."""
        return None

    def list_names(self) -> list[str] | None:
        """The names of the files directly in the folder, or None where the store cannot list (plain HTTP)."""
        raise NotImplementedError

    def list_sizes(self) -> dict[str, int] | None:
        """The files directly in the folder and their sizes, or None where the store cannot list (plain HTTP)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what this process holds open (it reopens on the next read)."""
