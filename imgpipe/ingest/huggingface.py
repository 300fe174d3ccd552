"""Scan Hugging Face's ``ILSVRC/imagenet-1k`` downloads: today's Parquet files, or the earlier tarballs.

Both name a file ``<name>_<wnid>.JPEG``: its item is the extracted tree's ``train/<wnid>/<name>.JPEG``
(flat ``val/``), in that tree's order and with its labels (rows without such a name: by ``label``,
``classnames``). A unit is one Parquet file, read with pyarrow a row group at a time (``parquet``), or
one whole ``.tar.gz`` (the members ``datasets``' ``iter_archive`` yields); each item is (unit, ordinal,
size), read by ``scatter``. Listings are kept in the pack journal, keyed by path, size and mtime.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.procs import map_in_processes
from imgpipe._sys.threads import DaemonPool
from imgpipe.errors import DatasetError
from imgpipe.format.manifest import stays_inside_source_root
from imgpipe.ingest.classnames import names_for_indices
from imgpipe.ingest.filekinds import is_source_file, tar_reason
from imgpipe.ingest.folders import NEWLINE_REASON, SourceTree, SplitItems, match_archive_name, warn_left_out
from imgpipe.ingest.imagenet_tars import ESCAPE_REASON
from imgpipe.ingest.parquet import (
    IMAGE_COLUMN,
    LABEL_COLUMN,
    PATH_COLUMN,
    check_columns,
    label_values,
    open_parquet,
    pyarrow_parquet,
    read_row_group,
    release_memory,
    row_group_images,
    struct_field,
)
from imgpipe.ingest.streams import StreamItems, StreamUnit, list_tar_gz

logger = logging.getLogger(__name__)

PARQUET_NAME = re.compile(r"(?P<split>train|validation|test)-\d+-of-\d+\.parquet")  # the whole file name
TAR_GZ_NAME = re.compile(r"(?P<split>train|val|test)_images(?:_\d+)?\.tar\.gz")
SPLITS = {"train": "train", "validation": "val", "val": "val"}
HF_NAME = re.compile(r"^(?P<name>.+)_(?P<wnid>n\d{8})\.JPEG$")
HIDDEN = (".", "__")  # iter_archive skips members whose base name starts so
LISTING_VERSION = 3  # of the cached listings' content


@dataclass(frozen=True)
class HfFiles:
    """A Hugging Face download: its layout, the root item paths are relative to, and each split's files."""

    layout: str  # "hf-parquet" or "hf-tar"
    root: Path
    splits: dict[str, list[Path]]


@dataclass
class _Row:
    """One listed file or member: the name the loader sees, its unit and ordinal, size, label (-1 unknown)."""

    name: str
    unit: int
    ordinal: int
    size: int
    label: int = -1


def find_hf(src: str | os.PathLike | Sequence[str | os.PathLike]) -> HfFiles | None:
    """The Hugging Face files SRC names: a folder holding them (or their ``data/``), or the files one by one."""
    if isinstance(src, (str, os.PathLike)):
        path = Path(os.path.abspath(src))
        if path.is_dir():
            if (path / "train").is_dir() or (path / "ILSVRC").is_dir():
                return None
            folder = path / "data" if (path / "data").is_dir() else path
            paths, root = sorted(folder.iterdir()), path
        else:
            paths, root = [path], path.parent
    else:
        paths = [Path(os.path.abspath(p)) for p in src]
        root = Path(os.path.commonpath([p.parent for p in paths]))
    for layout, pattern in (("hf-parquet", PARQUET_NAME), ("hf-tar", TAR_GZ_NAME)):
        splits: dict[str, list[Path]] = {}
        matched = [(p, match_archive_name(pattern, p)) for p in paths]
        for p, match in matched:
            if match and match["split"] in SPLITS and is_source_file(p):
                splits.setdefault(SPLITS[match["split"]], []).append(p)
        if splits and (isinstance(src, (str, os.PathLike)) or all(m for _, m in matched)):
            ordered = {s: sorted(splits[s]) for s in ("train", "val") if s in splits}
            return HfFiles(layout, root, ordered)
    return None


def scan_hf(files: HfFiles, splits: Sequence[str] | None, workers: int | None = None, cache: Path | None = None) -> SourceTree:
    """The classes and items of a Hugging Face download, like ``folders.scan_folders`` gives for its extracted tree."""
    wanted = list(files.splits) if splits is None else list(dict.fromkeys(splits))
    missing = [s for s in wanted if s not in files.splits]
    if missing:
        raise DatasetError(f"{files.root}: split {', '.join(map(repr, missing))} not found (these files hold: {', '.join(files.splits)})")
    if files.layout == "hf-parquet":
        pyarrow_parquet()  # imported once here, before the listing and pack workers fork, not once in each
    label_split = "train" if "train" in files.splits else "val"
    listed = {split: _list_split(files, split, workers, cache) for split in dict.fromkeys([label_split, *wanted])}
    named = {split: all(HF_NAME.match(row.name.rsplit("/", 1)[-1]) for row in rows) for split, (_, rows, _) in listed.items()}
    by_wnid = named[label_split] and all(named[s] for s in wanted)
    if by_wnid:
        if files.layout == "hf-parquet":
            _check_labels(*listed[label_split][:2])
        classes = sorted({_wnid(row) for row in listed[label_split][1]})
        index = {wnid: k for k, wnid in enumerate(classes)}
    else:
        names = names_for_indices(row.label for row in listed[label_split][1] if row.label >= 0)
        classes = sorted(names.values())
        index = {name: k for k, name in enumerate(classes)}
    tree = SourceTree(root=files.root, layout=files.layout, classes=classes)
    for split in wanted:
        units, rows, irregular = listed[split]
        tree.splits[split] = _items(files, split, units, rows, index, None if by_wnid else names)
        for path, reason in irregular:
            warn_left_out(files.root, path, reason)
        tree.splits[split].rejected[:0] = irregular
        logger.info("%s: %d images in %d file(s)", split, len(tree.splits[split]), len(files.splits[split]))
    return tree


def _wnid(row: _Row) -> str:
    return HF_NAME.match(row.name.rsplit("/", 1)[-1])["wnid"]  # type: ignore[index]


def _items(
    files: HfFiles, split: str, units: list[StreamUnit], rows: list[_Row], index: dict[str, int], names: dict[int, str] | None
) -> SplitItems:
    """The split's items in the extracted tree's order: train by class, then file name; val by file name."""
    shown = {unit.path: unit.path.relative_to(files.root).as_posix() for unit in units}
    labels, tree_names, paths, rejected = [], [], [], []
    keep = []
    seen: dict[tuple[int, str], str] = {}
    for k, row in enumerate(rows):
        path = f"{shown[units[row.unit].path]}/{row.name}"
        if names is None:
            match = HF_NAME.match(row.name.rsplit("/", 1)[-1])
            wnid, tree_name = match["wnid"], match["name"] + ".JPEG"  # type: ignore[index]
            if wnid not in index:
                raise DatasetError(f"{units[row.unit].path}: {row.name}: class {wnid} is not one of the {len(index)} train classes")
            label = index[wnid]
        else:
            if row.label not in names:
                raise DatasetError(f"{units[row.unit].path}: {row.name}: label {row.label} is not a train label")
            label, tree_name = index[names[row.label]], row.name
        if not stays_inside_source_root(row.name) or "\n" in row.name:
            reason = NEWLINE_REASON if "\n" in row.name else ESCAPE_REASON
            warn_left_out(units[row.unit].path, row.name, reason)
            rejected.append((path, reason))
            continue
        where = (label if split == "train" else -1, tree_name)
        if where in seen:
            raise DatasetError(
                f"{units[row.unit].path}: {row.name} is the file {tree_name} of {seen[where]} too; the extracted tree has one"
            )
        seen[where] = path
        keep.append(k)
        labels.append(label)
        tree_names.append(tree_name.rpartition("/")[::2])
        paths.append(path)
    order = sorted(range(len(keep)), key=lambda j: (labels[j], tree_names[j]) if split == "train" else tree_names[j])
    chosen = [rows[keep[j]] for j in order]
    items = StreamItems(
        tuple(units), np.array([row.unit for row in chosen], np.int32), np.array([row.ordinal for row in chosen], np.int64),
        np.array([row.size for row in chosen], np.int64),
    )  # fmt: skip
    return SplitItems([paths[j] for j in order], np.array([labels[j] for j in order], np.int32), rejected, items)


def _check_labels(units: list[StreamUnit], rows: list[_Row]) -> None:
    """A Parquet ``label`` must name one class: the same for every row of a wnid, another for every other wnid."""
    label_of: dict[str, int] = {}
    wnid_of: dict[int, str] = {}
    for row in rows:
        wnid = _wnid(row)
        if label_of.setdefault(wnid, row.label) != row.label or wnid_of.setdefault(row.label, wnid) != wnid:
            other = wnid_of[row.label] if wnid_of[row.label] != wnid else wnid
            raise DatasetError(
                f"{units[row.unit].path}: {row.name}: label {row.label} also labels {other} rows; the labels and the file names disagree"
            )


# ----------------------------------------------------------------------------- listing


def _list_split(
    files: HfFiles, split: str, workers: int | None, cache: Path | None
) -> tuple[list[StreamUnit], list[_Row], list[tuple[str, str]]]:
    """The split's units and rows in file order, and (path, reason) of the members that are not regular files; listing each
    file once (``workers`` at a time) or taking it from ``cache``."""
    paths = files.splits[split]
    lister = _list_parquet if files.layout == "hf-parquet" else _list_tar_gz
    tasks = [(lister, path, cache) for path in paths]
    parallel = min(workers or available_cpus(), len(tasks))
    units: list[StreamUnit] = []
    rows: list[_Row] = []
    irregular: list[tuple[str, str]] = []
    if files.layout == "hf-parquet":  # pyarrow reads without the GIL: threads, with no process to start
        listings = _in_threads(tasks, parallel)
        release_memory()  # before the pack's workers fork: one writing into the listing's freed pages would copy each
    else:  # tarfile's stream reading holds the GIL between small reads: processes
        listings = list(map_in_processes(_listed, tasks, workers=parallel))
    for path, listing in zip(paths, listings):
        file_units, file_rows, file_irregular = _load_listing(path, listing)
        for row in file_rows:
            row.unit += len(units)
        units += file_units
        rows += file_rows
        irregular += [(f"{path.relative_to(files.root).as_posix()}/{name}", reason) for name, reason in file_irregular]
    return units, rows, irregular


def _in_threads(tasks: list[tuple[Any, Path, Path | None]], threads: int) -> list[bytes]:
    """``_listed`` of each task in daemon threads: an interrupt leaves at once, never waiting for a listing to end."""
    pool = DaemonPool(threads, "imgpipe-listing")
    futures = [pool.submit(_listed, task) for task in tasks]
    try:
        return [future.result() for future in futures]
    finally:
        for future in futures:
            future.cancel()
        pool.close()


def _listed(task: tuple[Any, Path, Path | None]) -> bytes:
    """One file's listing as ``_listing_bytes`` (compact to send back from a worker), from ``cache`` when it is there."""
    lister, path, cache = task
    stat = path.stat()
    key = hashlib.sha256(f"{LISTING_VERSION}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    cached = cache / f"listing-{key}.npz" if cache is not None else None
    if cached is not None and cached.is_file():
        try:
            data = cached.read_bytes()
            _load_listing(path, data)
            return data
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # EOFError: an empty file
            logger.info("%s: unreadable listing cache, listing again", cached)
    data = _listing_bytes(*lister(path))
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cached, data)
    return data


def _listing_bytes(units: list[StreamUnit], rows: list[_Row], irregular: list[tuple[str, str]]) -> bytes:
    buffer = io.BytesIO()
    text = lambda parts: np.frombuffer("\0".join(parts).encode("utf-8", "surrogateescape"), np.uint8)  # noqa: E731
    np.savez(
        buffer, names=text(row.name for row in rows),
        fields=np.array([(row.unit, row.ordinal, row.size, row.label) for row in rows], np.int64).reshape(-1, 4),
        parquet=np.array([unit.parquet for unit in units], bool), irregular=text(part for pair in irregular for part in pair),
    )  # fmt: skip
    return buffer.getvalue()


def _load_listing(path: Path, listing: bytes) -> tuple[list[StreamUnit], list[_Row], list[tuple[str, str]]]:
    with np.load(io.BytesIO(listing), allow_pickle=False) as data:
        names, irregular = (_split(data[key]) for key in ("names", "irregular"))
        fields = data["fields"].tolist()
        units = [StreamUnit(path, bool(parquet)) for parquet in data["parquet"]]
    if len(names) != len(fields) or len(irregular) % 2:
        raise ValueError("listing cache does not match itself")
    return units, [_Row(name, *row) for name, row in zip(names, fields)], list(zip(irregular[::2], irregular[1::2]))


def _split(text: np.ndarray) -> list[str]:
    """The NUL-separated strings of ``_listing_bytes`` (a name never holds a NUL)."""
    decoded = text.tobytes().decode("utf-8", "surrogateescape")
    return decoded.split("\0") if decoded else []


def _list_tar_gz(path: Path) -> tuple[list[StreamUnit], list[_Row], list[tuple[str, str]]]:
    """The ``.JPEG`` files the loading script reads from one ``.tar.gz``: the regular members ``iter_archive`` yields; and
    (name, reason) of the ``.JPEG`` members that are not regular files (links, devices), which it skips too."""
    entries = list_tar_gz(path)
    rows, irregular, ignored = [], [], 0
    for entry in entries:
        if not entry.name.endswith(".JPEG") or entry.type == tarfile.DIRTYPE:
            continue
        if entry.name.rsplit("/", 1)[-1].startswith(HIDDEN):
            ignored += 1
        elif (reason := tar_reason(entry)) is not None:
            irregular.append((entry.name, reason))
        else:
            rows.append(_Row(entry.name, 0, entry.offset, entry.size))
    if ignored:
        logger.info("%s: ignored %d .JPEG members iter_archive skips (names starting with . or __)", path, ignored)
    if entries and not rows and not irregular:
        raise DatasetError(f"{path}: no .JPEG members; is this a Hugging Face imagenet-1k tarball?")
    for row in rows:
        if not HF_NAME.match(row.name.rsplit("/", 1)[-1]):
            raise DatasetError(f"{path}: member {row.name} is not named <image>_<wnid>.JPEG, so its class is unknown")
    return [StreamUnit(path)], rows, irregular


def _list_parquet(path: Path) -> tuple[list[StreamUnit], list[_Row], list[tuple[str, str]]]:
    """Every row of one Parquet file: its path (or a name from its position), image size and label."""
    with open_parquet(path) as parquet:
        return [StreamUnit(path, parquet=True)], _parquet_rows(path, parquet), []


def _parquet_rows(path: Path, parquet: Any) -> list[_Row]:
    """Each column read on its own, so that pyarrow's refusal names the column."""
    with_path = check_columns(path, parquet.schema_arrow)
    rows: list[_Row] = []
    for group in range(parquet.metadata.num_row_groups):
        sizes = row_group_images(path, parquet, group).sizes.tolist()
        paths = [None] * len(sizes)
        if with_path:
            paths = struct_field(read_row_group(path, parquet, group, [PATH_COLUMN]).column(IMAGE_COLUMN), "path").to_pylist()
        labels = label_values(path, read_row_group(path, parquet, group, [LABEL_COLUMN]), group)
        for name, size, label in zip(paths, sizes, labels):
            rows.append(_Row(name or f"{path.stem}-{len(rows):08d}.JPEG", 0, len(rows), size, label))
    return rows
