"""Where ``imgpipe stage`` writes: a local folder or a URL, and the journal of the files it verified there.

The journal lives in ``DST/.imgpipe-stage/``: one empty file per verified file, named
``{file}.{size}.{sha256}.done`` (so one listing reads the whole journal, on a disk or in a
bucket), written after the file is in place. A local DST also holds there the partial files
(``{file}.part``, renamed into DST once verified), the lock and the record of a failed stage.
"""

from __future__ import annotations

import os
from pathlib import Path

from imgpipe._sys.atomic import atomic_write_bytes, fsync_dir
from imgpipe._sys.oserrors import describe, write_probe
from imgpipe._sys.regular import read_regular
from imgpipe.errors import DatasetError
from imgpipe.format.manifest import MANIFEST_NAME
from imgpipe.format.unfinished import STAGE_DIR, STAGED_SUFFIX
from imgpipe.storage.opening import open_source
from imgpipe.storage.source import url_scheme

PART_SUFFIX = ".part"
DONE_SUFFIX = STAGED_SUFFIX
LOCK_NAME = "lock"
FAILED_NAME = "failed.json"


def entry_name(name: str, size: int, sha256: str) -> str:
    """The journal entry of a verified file."""
    return f"{name}.{size}.{sha256}{DONE_SUFFIX}"


def parse_entry(entry: str) -> tuple[str, int, str] | None:
    """(file, size, sha256) of a journal entry's name; None for anything else."""
    if not entry.endswith(DONE_SUFFIX):
        return None
    try:
        name, size, sha256 = entry[: -len(DONE_SUFFIX)].rsplit(".", 2)
        return name, int(size), sha256
    except ValueError:
        return None


def _entries(names: list[str]) -> set[tuple[str, int, str]]:
    return {parsed for entry in names if (parsed := parse_entry(entry)) is not None}


class LocalTarget:
    """A local folder (a node's disk, or any mounted path)."""

    remote = False

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.location = str(folder)
        self.journal = self.folder / STAGE_DIR

    def where(self, name: str) -> str:
        return str(self.folder / name)

    def prepare(self) -> None:
        """Make DST and its journal folder; one line when that, or writing there, is refused."""
        if self.folder.exists() and not self.folder.is_dir():
            raise DatasetError(f"{self.folder}: is a file, not a folder; choose another DST")
        try:
            self.journal.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DatasetError(f"{self.folder}: cannot make the folder: {describe(e, writing=True)}; or choose another DST") from None
        refused = write_probe(self.journal)
        if refused is not None:
            raise DatasetError(f"{self.folder}: cannot write there: {describe(refused, writing=True)}; or choose another DST")

    def manifest_bytes(self) -> bytes | None:
        path = self.folder / MANIFEST_NAME
        try:
            return read_regular(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise DatasetError(f"{path}: cannot read it ({e.strerror}); move it away, or choose another DST") from None

    def sizes(self) -> dict[str, int]:
        """The files directly in DST and their sizes."""
        if not self.folder.is_dir():
            return {}
        return {entry.name: entry.stat().st_size for entry in os.scandir(self.folder) if entry.is_file(follow_symlinks=False)}

    def entries(self) -> set[tuple[str, int, str]]:
        """The journal: (file, size, sha256) of each file verified in place."""
        return _entries(os.listdir(self.journal)) if self.journal.is_dir() else set()

    def part(self, name: str) -> Path:
        """Where file ``name`` is written until it is verified."""
        return self.journal / (name + PART_SUFFIX)

    def commit(self, name: str, part: Path) -> None:
        """Move a verified partial file into place and journal it (its data was synced by the caller)."""
        os.replace(part, self.folder / name)
        fsync_dir(self.folder)

    def record(self, name: str, size: int, sha256: str) -> None:
        """Journal a verified file that is in place."""
        with open(self.journal / entry_name(name, size, sha256), "wb"):
            pass
        fsync_dir(self.journal)

    def remove(self, names: list[str]) -> None:
        for name in names:
            (self.folder / name).unlink(missing_ok=True)

    def remove_parts(self) -> None:
        """Drop partial files a killed stage left (they are copied again)."""
        for path in self.journal.glob("*" + PART_SUFFIX):
            path.unlink(missing_ok=True)

    def write_manifest(self, data: bytes) -> None:
        atomic_write_bytes(self.folder / MANIFEST_NAME, data)

    def remove_manifest(self) -> None:
        (self.folder / MANIFEST_NAME).unlink(missing_ok=True)
        fsync_dir(self.folder)

    def clear_journal(self) -> None:
        """Drop the entries, partial files and failure record once the manifest is written (the lock stays)."""
        for entry in os.listdir(self.journal):
            if entry != LOCK_NAME:
                (self.journal / entry).unlink(missing_ok=True)

    @property
    def lock_path(self) -> Path:
        return self.journal / LOCK_NAME

    @property
    def failure_path(self) -> Path:
        return self.journal / FAILED_NAME


class StoreTarget:
    """A folder at a URL of an object store (S3, GCS, Azure); a plain HTTP server cannot be written."""

    remote = True

    def __init__(self, url: str) -> None:
        from imgpipe.storage.objectstore import ObjectStoreSource

        if url_scheme(url) in ("http", "https"):
            raise DatasetError(f"{url}: imgpipe cannot write to a plain HTTP server; give an s3://, gs:// or az:// URL, or a local folder")
        store = open_source(url)  # an unsupported scheme is one line here, as for SRC
        assert isinstance(store, ObjectStoreSource)
        self.store = store
        self.location = self.store.location
        self._journal = ObjectStoreSource(f"{self.location}/{STAGE_DIR}")

    def where(self, name: str) -> str:
        return self.store.where(name)

    def prepare(self) -> None:
        """A missing bucket or refused credentials fail here, in one line, before anything is copied."""
        self.store.list_sizes()

    def manifest_bytes(self) -> bytes | None:
        try:
            return self.store.read_file(MANIFEST_NAME)
        except FileNotFoundError:
            return None

    def sizes(self) -> dict[str, int]:
        return self.store.list_sizes() or {}

    def entries(self) -> set[tuple[str, int, str]]:
        return _entries(list(self._journal.list_sizes() or {}))

    def upload(self, name: str, path: str | os.PathLike) -> tuple[int, str]:
        """Upload a local file as ``name``: its size and the sha256 of the bytes sent."""
        return self.store.upload(name, path)

    def size(self, name: str) -> int:
        return self.store.size(name)

    def record(self, name: str, size: int, sha256: str) -> None:
        self._journal.write_file(entry_name(name, size, sha256), b"")

    def remove(self, names: list[str]) -> None:
        self.store.delete(names)

    def write_manifest(self, data: bytes) -> None:
        self.store.write_file(MANIFEST_NAME, data)

    def remove_manifest(self) -> None:
        self.store.delete([MANIFEST_NAME])

    def clear_journal(self) -> None:
        self._journal.delete(list(self._journal.list_sizes() or {}))


Target = LocalTarget | StoreTarget
