"""The dataset manifest (``manifest.json``): dataclasses <-> JSON, checksums, safe names.

Records of a split are numbered 0..N-1 in shard order (a record's *index*); the IRHeader ``id`` and the
.idx key are the item's position in the pack plan, stable whatever was skipped (they increase through
the split, with gaps). Every name in the manifest is a plain file name inside DST and every source path
is relative to the source root: a manifest can never point outside its dataset folder. The files it
lists, and their names, are ``files``'.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.jsonfile import as_dataclass, parse_json
from imgpipe._sys.regular import read_regular
from imgpipe.errors import DatasetError
from imgpipe.format.files import MANIFEST_NAME
from imgpipe.format.unfinished import JOURNAL_DIR, PLAN_NAME, incomplete_folder  # noqa: F401  (imgpipe.packing.journal imports the names from here)
from imgpipe.storage.opening import open_source
from imgpipe.storage.source import ByteSource, is_url

FORMAT = "imgpipe-recordio"
FORMAT_VERSION = 1

T = TypeVar("T")


@dataclass
class ShardInfo:
    """One finished shard: its files, record count and checksums."""

    name: str
    index: str
    records: int
    bytes: int
    sha256: str
    index_bytes: int
    index_sha256: str


@dataclass
class SplitInfo:
    """One split: its shards in order and the sidecars of source paths and labels."""

    shards: list[ShardInfo]
    sources: str
    sources_sha256: str
    labels: str
    labels_sha256: str
    checksums: str = ""  # optional sidecar of per-record crc32s ("" when absent); lets verify locate a corrupt record
    checksums_sha256: str = ""
    index_sidecar: str = ""  # optional: every .idx of the split as one array ("" when absent), so a split opens with one read
    index_sidecar_sha256: str = ""

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


@dataclass
class Skipped:
    """A source file that was not packed, and why."""

    split: str
    path: str
    reason: str

    def __str__(self) -> str:
        """``split: path: reason`` on one line (control characters in the path escaped)."""
        path = self.path.replace("\n", "\\n").replace("\r", "\\r")
        return f"{self.split}: {path}: {self.reason}"


@dataclass
class Manifest:
    """Everything a reader needs to trust and use a packed dataset."""

    classes: list[str]
    splits: dict[str, SplitInfo]
    options: dict[str, Any]
    source: str
    skipped: list[Skipped] = field(default_factory=list)
    fingerprint: str = ""  # the pack plan's: lets a rerun recognise a finished pack whose journal is gone ("" if unknown)
    layout: str = ""  # the source layout pack read: imagenet, kaggle, tarballs, hf-parquet, wds, ... ("" if unknown)
    format: str = FORMAT
    version: int = FORMAT_VERSION

    def to_json(self) -> str:
        data = asdict(self)
        for name, split in self.splits.items():
            data["splits"][name]["records"] = split.records
            data["splits"][name]["bytes"] = split.bytes
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: object = MANIFEST_NAME) -> "Manifest":
        """Build and validate a Manifest; a DatasetError names what is wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise DatasetError(f"{where}: not an imgpipe manifest (format {data.get('format') if isinstance(data, dict) else None!r})")
        if type(data.get("version")) is not int or data["version"] != FORMAT_VERSION:
            raise DatasetError(
                f"{where}: manifest version {data.get('version')!r} is not supported (this imgpipe reads {FORMAT_VERSION}); "
                "repack with this version of imgpipe"
            )
        try:
            splits = {
                name: _from_json(
                    SplitInfo, {**_known(SplitInfo, split), "shards": [_from_json(ShardInfo, s, where) for s in split["shards"]]}, where
                )
                for name, split in data["splits"].items()
            }
            skipped = [_from_json(Skipped, s, where) for s in data.get("skipped", [])]
        except (KeyError, TypeError, AttributeError) as e:
            raise DatasetError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None
        manifest = _from_json(cls, {**_known(cls, data), "splits": splits, "skipped": skipped}, where)
        listed: set[str] = set()
        for name, split in manifest.splits.items():
            check_plain_name(name, where)
            files = [split.sources, split.labels, *(f for f in (split.checksums, split.index_sidecar) if f)]
            for file in [*files, *(f for shard in split.shards for f in (shard.name, shard.index))]:
                check_plain_name(file, where)
                if file in listed:
                    raise DatasetError(f"{where}: {file} is listed twice; rerun 'imgpipe pack' to rewrite the manifest")
                listed.add(file)
            for shard in split.shards:
                if shard.records < 0 or shard.bytes < 0:
                    raise DatasetError(f"{where}: shard {shard.name} has a negative count")
            for total in ("records", "bytes"):  # written beside the shards for readers; they must agree
                stored = data["splits"][name].get(total, getattr(split, total))
                if type(stored) is not int or stored != getattr(split, total):
                    raise DatasetError(
                        f"{where}: split {name} has {total} {stored!r}, its shards {getattr(split, total)}; "
                        "rerun 'imgpipe pack' to rewrite the manifest"
                    )
        return manifest


def _from_json(cls: type[T], value: Any, where: object) -> T:
    """``cls`` from its JSON object, each field of its declared type (``as_dataclass``): ``"records": "x"``, 8.5 records,
    ``"classes": "abcd"`` are refused, not converted."""
    try:
        return as_dataclass(cls, value)
    except ValueError as e:
        raise DatasetError(f"{where}: malformed manifest ({cls.__name__} {e}); rerun 'imgpipe pack' to rewrite it") from None


def _known(cls: type, value: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``value`` that are fields of ``cls``: the manifest's and a split's other keys (a split's ``records``
    and ``bytes``, checked against its shards; those a newer imgpipe may add) are left out."""
    names = {f.name for f in fields(cls)}
    return {key: item for key, item in value.items() if key in names}


def check_plain_name(name: str, where: object = MANIFEST_NAME) -> str:
    """Refuse any name that is not a plain file name (no folders, no '..', not absolute)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise DatasetError(f"{where}: {name!r} is not a plain file name inside the dataset folder")
    return name


def stays_inside_source_root(path: str) -> bool:
    """True when a sidecar source path is relative and never climbs out of the source root.

    String tests, not PurePosixPath: verify runs this on every one of 1.28 M lines.
    """
    return bool(path) and not path.startswith("/") and "\0" not in path and "/../" not in f"/{path}/"


def manifest_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / MANIFEST_NAME


def load_manifest(folder: str | os.PathLike) -> Manifest:
    """Read and validate ``folder/manifest.json`` (``folder`` may be a URL)."""
    if is_url(folder):
        return read_manifest(open_source(folder))
    path = manifest_path(folder)
    try:
        text = read_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        raise DatasetError(incomplete_folder(folder) or f"{path}: no manifest; is {folder} a folder made by 'imgpipe pack'?") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the manifest ({e.strerror})") from None
    return parse_manifest(text, path)


def read_manifest(source: ByteSource) -> Manifest:
    """Read and validate the manifest of the folder ``source`` serves."""
    return fetch_manifest(source)[1]


def fetch_manifest(source: ByteSource) -> tuple[bytes, Manifest]:
    """The manifest's bytes, and the manifest they validate as, of the folder ``source`` serves."""
    where = source.where(MANIFEST_NAME)
    try:
        text = source.read_file(MANIFEST_NAME)
    except FileNotFoundError:
        raise DatasetError(f"{where}: no manifest; is {source.location} a folder made by 'imgpipe pack'?") from None
    except OSError as e:
        raise DatasetError(f"{where}: cannot read the manifest ({e.strerror or e})") from None
    return text, parse_manifest(text, where)


def parse_manifest(text: bytes, where: object) -> Manifest:
    """A manifest from its bytes; ``where`` names it in errors."""
    data = parse_json(text, where, "manifest", "rerun 'imgpipe pack' to rewrite it", DatasetError)
    return Manifest.from_dict(data, where)


def write_manifest(folder: str | os.PathLike, manifest: Manifest) -> Path:
    """Write the manifest atomically: temp file, fsync, rename."""
    path = manifest_path(folder)
    atomic_write_bytes(path, manifest.to_json().encode("utf-8"))
    return path
