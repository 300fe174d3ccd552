"""The files of a packed folder, as its manifest names them, with what to check each against."""

from __future__ import annotations

from dataclasses import dataclass

from imgpipe.errors import DatasetError
from imgpipe.format.manifest import MANIFEST_NAME, Manifest


@dataclass(frozen=True)
class StagedFile:
    """A file to copy: its name, the sha256 the manifest gives, and its size in bytes.

    ``listed_size`` is the manifest's size (shards and their indexes), or None for a sidecar:
    the manifest holds a sidecar's sha256 but not its size, which the source then tells.
    """

    name: str
    sha256: str
    size: int
    listed_size: int | None


@dataclass(frozen=True)
class ListedFile:
    """A file the manifest names: its sha256 and, for shards and indexes, its size."""

    name: str
    sha256: str
    size: int | None


def manifest_files(manifest: Manifest, where: object = MANIFEST_NAME) -> list[ListedFile]:
    """Every file the manifest names, in its order: each split's shards and indexes, then its sidecars.

    A name listed twice is a ``DatasetError`` (``where``: the manifest, in the message).
    """
    files: list[ListedFile] = []
    for split in manifest.splits.values():
        for shard in split.shards:
            files.append(ListedFile(shard.name, shard.sha256, shard.bytes))
            files.append(ListedFile(shard.index, shard.index_sha256, shard.index_bytes))
        files.append(ListedFile(split.labels, split.labels_sha256, None))
        files.append(ListedFile(split.sources, split.sources_sha256, None))
        if split.checksums:  # absent in packs made before the crc32 sidecar
            files.append(ListedFile(split.checksums, split.checksums_sha256, None))
    seen: set[str] = set()
    for listed in files:
        if listed.name in seen:
            raise DatasetError(f"{where}: names {listed.name} twice; rerun 'imgpipe pack'")
        seen.add(listed.name)
    return files
