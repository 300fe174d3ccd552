"""The files of a packed folder, as its manifest names them, with what to check each against.

The manifest holds the sha256 of every file it names, and the size of the shards and indexes.
A file whose sha256 it lacks (a manifest edited by hand) is checked by its size and, for an
index or a sidecar, by parsing it with the reader the loaders use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from imgpipe.errors import DatasetError, RecordIOError
from imgpipe.format.files import SidecarError, parse_checksums, parse_index_sidecar, parse_labels, parse_sources
from imgpipe.format.manifest import MANIFEST_NAME, Manifest
from imgpipe.format.recordio import parse_index

Parse = Callable[[bytes], object]  # raises SidecarError (or DatasetError) when the bytes are not what the manifest says


@dataclass(frozen=True)
class ListedFile:
    """A file the manifest names: its sha256 and, for shards and indexes, its size; how to parse it."""

    name: str
    sha256: str
    size: int | None
    parse: Parse | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StagedFile:
    """A file to copy: ``size`` is its size at the source (the manifest's, for shards and indexes)."""

    name: str
    sha256: str
    size: int
    parse: Parse | None = field(default=None, compare=False)


def staged(listed: ListedFile, size: int) -> StagedFile:
    return StagedFile(listed.name, listed.sha256, size, listed.parse)


def manifest_files(manifest: Manifest, where: object = MANIFEST_NAME) -> list[ListedFile]:
    """Every file the manifest names, in its order: each split's shards and indexes, then its sidecars.

    A name listed twice is a ``DatasetError`` (``where``: the manifest, in the message).
    """
    files: list[ListedFile] = []
    classes = len(manifest.classes)
    for split in manifest.splits.values():
        count = split.records
        for shard in split.shards:
            files.append(ListedFile(shard.name, shard.sha256, shard.bytes))
            files.append(ListedFile(shard.index, shard.index_sha256, shard.index_bytes, partial(_index, records=shard.records)))
        files.append(ListedFile(split.labels, split.labels_sha256, None, partial(parse_labels, count=count, classes=classes)))
        files.append(ListedFile(split.sources, split.sources_sha256, None, partial(parse_sources, count=count)))
        if split.checksums:  # absent in packs made before the crc32 sidecar
            files.append(ListedFile(split.checksums, split.checksums_sha256, None, partial(parse_checksums, count=count)))
        if split.index_sidecar:  # absent in packs made before the index sidecar
            files.append(ListedFile(split.index_sidecar, split.index_sidecar_sha256, None, partial(parse_index_sidecar, count=count)))
    seen: set[str] = set()
    for listed in files:
        if listed.name in seen:
            raise DatasetError(f"{where}: names {listed.name} twice; rerun 'imgpipe pack'")
        seen.add(listed.name)
    return files


def _index(data: bytes, records: int) -> None:
    """An index's check without its sha256: it parses, with a line per record."""
    try:
        keys, _ = parse_index(data, "the index")
    except RecordIOError as e:
        raise SidecarError(e.problem) from None
    if keys.size != records:
        raise SidecarError(f"{keys.size} lines, the manifest counts {records} records")
