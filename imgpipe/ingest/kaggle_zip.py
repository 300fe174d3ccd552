"""Scan Kaggle's ``imagenet-object-localization-challenge.zip`` in place: no extraction.

The zip holds the Kaggle download's ``ILSVRC/Data/CLS-LOC/{train,val}``, val labelled by
``LOC_val_solution.csv`` (inside the zip, or beside it). Its central directory gives every member's
offset, sizes, method and crc32; items are the extracted tree's, in its order and with its labels, and
a worker reads each member at its offset (stored, or inflated) and checks the crc32. Items are its files, the
last of a repeated name as extraction leaves it (links and devices are listed as skipped); source paths start
with the zip's name.
"""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from imgpipe._sys.oserrors import advice, describe
from imgpipe.errors import DatasetError
from imgpipe.ingest.filekinds import is_source_file, zip_reason
from imgpipe.ingest.folders import KAGGLE_DATA, VAL_CSV, SourceTree, SplitItems, label_flat_val, warn_left_out
from imgpipe.ingest.imagenet_tars import HIDDEN, KEEP, NOT_AN_IMAGE, classify_member
from imgpipe.ingest.members import ZIP_DEFLATED, ZIP_LOCAL_HEADER, ZIP_STORED, ArchiveFile, MemberSpans, member_reader

logger = logging.getLogger(__name__)

LAYOUT = "kaggle-zip"
KAGGLE_ZIP = "imagenet-object-localization-challenge.zip"
DATA = "/".join(KAGGLE_DATA) + "/"
METHODS = {zipfile.ZIP_STORED: ZIP_STORED, zipfile.ZIP_DEFLATED: ZIP_DEFLATED}
MAX_DEFLATE_RATIO = 1032  # the most bytes deflate gives per byte of its stream (a 258-byte match in 2 bits)


def find_zip(src: str | os.PathLike | Sequence[str | os.PathLike]) -> Path | None:
    """The zip SRC names: a ``.zip`` file, or a folder holding Kaggle's zip by its name, or one zip and no folders."""
    if not isinstance(src, (str, os.PathLike)):
        paths = [Path(os.path.abspath(p)) for p in src]
        return paths[0] if len(paths) == 1 and paths[0].suffix.lower() == ".zip" else None
    path = Path(os.path.abspath(src))
    if path.suffix.lower() == ".zip" and is_source_file(path):
        return path
    if path.is_file():
        return None
    if not path.is_dir() or (path / "train").is_dir() or (path / "ILSVRC").is_dir():
        return None
    if is_source_file(path / KAGGLE_ZIP):
        return path / KAGGLE_ZIP
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    zips = [p for p in entries if p.suffix.lower() == ".zip" and p.is_file()]
    if len(zips) != 1 or any(p.is_dir() for p in entries):  # a zip among class folders is just a file there
        return None
    return zips[0]


def scan_zip(path: Path, splits: Sequence[str] | None) -> SourceTree:
    """The classes and items of the Kaggle zip, like ``folders.scan_folders`` gives for the extracted download."""
    archive = ArchiveFile.of(path)
    infos = _central_directory(path)
    prefix = _prefix(path, infos)
    files, irregular = _extracted(infos)
    data = prefix + DATA
    found = {split: data + split + "/" for split in ("train", "val") if any(name.startswith(data + split + "/") for name in files)}
    wanted = list(found) if splits is None else list(dict.fromkeys(splits))
    missing = [s for s in wanted if s not in found]
    if missing:
        raise DatasetError(f"{path}: split {', '.join(map(repr, missing))} not found (this zip has: {', '.join(found) or 'no ' + data})")
    folders = {split: _class_folders(files, base) for split, base in found.items()}
    classes = folders["train"] if "train" in found else folders["val"]
    index = {name: i for i, name in enumerate(classes)}
    tree = SourceTree(root=path.parent, layout=LAYOUT, classes=classes)
    for split in wanted:
        base = found[split]
        names, split_rejected = _images(files, irregular, base, path.name)
        if split == "val" and not folders["val"]:
            labels = _val_labels(path, names, files, prefix, index, archive, infos)
        else:
            if not classes and split == "val":
                raise DatasetError(f"{path}: no {data}train/ class folders and a flat val; pack with the train split")
            unknown = sorted(set(folders[split]) - set(index))
            if unknown:
                raise DatasetError(f"{path}: {base}{unknown[0]}: {split} class {unknown[0]!r} is not a train class")
            names = [name for name in names if "/" in name[len(base) :]]  # a file beside the class folders is in no class
            labels = np.array([index[name[len(base) :].split("/", 1)[0]] for name in names], np.int32)
            order = np.lexsort(([n.rpartition("/")[2] for n in names], [n.rpartition("/")[0] for n in names], labels))
            names, labels = [names[k] for k in order.tolist()], labels[order]
        spans = _spans(path, archive, infos, [files[name] for name in names])
        for name, reason in split_rejected:
            warn_left_out(path, name, reason)
        listed = [(f"{path.name}/{name}", reason) for name, reason in split_rejected]
        tree.splits[split] = SplitItems([f"{path.name}/{name}" for name in names], labels, listed, spans)
        logger.info("%s: %d images in %s/%s", split, len(names), path, base)
    return tree


def _central_directory(path: Path) -> list[zipfile.ZipInfo]:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.infolist()
    except OSError as e:
        if advice(e, writing=False):
            raise DatasetError(f"{path}: cannot read it: {describe(e, writing=False)}") from None
        raise DatasetError(f"{path}: not a readable zip ({e}); download it again") from None
    except (zipfile.BadZipFile, ValueError, NotImplementedError) as e:  # NotImplementedError: a zip version zipfile does not read
        raise DatasetError(f"{path}: not a readable zip ({e}); download it again") from None


def _prefix(path: Path, infos: list[zipfile.ZipInfo]) -> str:
    """The folder above ``ILSVRC/Data/CLS-LOC/`` inside the zip: "" (Kaggle's) or one top folder."""
    for info in infos:
        at = info.filename.find(DATA)
        if at == 0 or (at > 0 and info.filename[at - 1] == "/" and info.filename[: at - 1].count("/") == 0):
            return info.filename[:at]
    raise DatasetError(f"{path}: no {DATA} inside; is this Kaggle's {KAGGLE_ZIP}?")


def _extracted(infos: list[zipfile.ZipInfo]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Name -> index in ``infos`` of every file extraction leaves (the last of a repeated name), and (name, reason) of
    each member that is a link or a device: listed as skipped, never read."""
    last: dict[str, int] = {}
    for k, info in enumerate(infos):
        if not info.filename.endswith("/"):  # not a folder (ZipInfo.is_dir fails on an empty name)
            last[info.filename] = k
    files, rejected = {}, []
    for name, k in last.items():
        reason = zip_reason(infos[k])
        if reason is None:
            files[name] = k
        else:
            rejected.append((name, reason))
    return files, rejected


def _spans(path: Path, archive: ArchiveFile, infos: list[zipfile.ZipInfo], items: list[int]) -> MemberSpans:
    """The spans of ``items`` (indices in ``infos``); a member imgpipe cannot read in place is a DatasetError."""
    chosen = [infos[k] for k in items]
    size = archive.size()
    for info in chosen:
        _check_span(path, info, size)
        if info.flag_bits & 0x1:
            raise DatasetError(f"{path}: member {info.filename} is encrypted; imgpipe reads unencrypted zips")
        if info.compress_type not in METHODS:
            raise DatasetError(
                f"{path}: member {info.filename} is compressed with zip method {info.compress_type}; "
                "imgpipe reads stored and deflated members: re-zip it (zip -r) or extract it"
            )
    column = lambda get, dtype: np.array([get(i) for i in chosen], dtype)  # noqa: E731
    return MemberSpans(
        (archive,), np.zeros(len(items), np.int32), column(lambda i: i.header_offset, np.int64), column(lambda i: i.file_size, np.int64),
        column(lambda i: METHODS[i.compress_type], np.int8), column(lambda i: i.compress_size, np.int64),
        column(lambda i: i.CRC, np.uint32),
    )  # fmt: skip


def _check_span(path: Path, info: zipfile.ZipInfo, size: int) -> None:
    """The central directory's offset and sizes of a member, bounded by the zip's bytes before any is read:
    its local header and data inside the file, as many bytes stored as it gives, no more than deflate can give."""
    corrupt = f"{path}: member {info.filename}"
    again = "download the zip again"
    end = info.header_offset + ZIP_LOCAL_HEADER.size + info.compress_size
    if info.header_offset < 0 or end > size:
        raise DatasetError(f"{corrupt}: its central directory places it at bytes {info.header_offset:,}-{end:,}, past the end of the "
                           f"{size:,}-byte zip: truncated or corrupt; {again}")  # fmt: skip
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise DatasetError(f"{corrupt}: stored, but {info.compress_size:,} bytes give {info.file_size:,}: corrupt; {again}")
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > MAX_DEFLATE_RATIO * (info.compress_size + 1):
        raise DatasetError(f"{corrupt}: {info.compress_size:,} deflated bytes cannot give {info.file_size:,}: corrupt; {again}")


def _class_folders(files: dict[str, int], base: str) -> list[str]:
    """The visible class folder names under ``base`` (sorted as ImageFolder sorts them)."""
    return sorted({rest.split("/", 1)[0] for name in files if name.startswith(base) and "/" in (rest := name[len(base) :])
                   and not rest.startswith(".")})  # fmt: skip


def _images(files: dict[str, int], irregular: list[tuple[str, str]], base: str, zip_name: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The image files under ``base`` (sorted as a flat folder sorts), and (name, reason) of those left out: links and
    devices (``irregular``) and names that cannot be stored; hidden names are left out silently."""
    names, rejected, ignored = [], [], 0
    reasons = dict(irregular)
    for name in [*files, *reasons]:
        if not name.startswith(base):
            continue
        fate = classify_member(name, name[len(base) :])
        if fate == KEEP and name in reasons:
            rejected.append((name, reasons[name]))
        elif fate == KEEP:
            names.append(name)
        elif fate == NOT_AN_IMAGE:
            ignored += 1
        elif fate != HIDDEN:
            rejected.append((name, fate))
    if ignored:
        logger.info("%s/%s: ignored %d members without an image extension", zip_name, base, ignored)
    return sorted(names, key=lambda name: name.rpartition("/")[::2]), rejected


def _val_labels(
    path: Path,
    names: list[str],
    files: dict[str, int],
    prefix: str,
    index: dict[str, int],
    archive: ArchiveFile,
    infos: list[zipfile.ZipInfo],
) -> np.ndarray:
    """Labels of the flat val images from ``LOC_val_solution.csv``: the zip's own, else one beside the zip."""
    shown = [f"{path.name}/{name}" for name in names]
    inside = prefix + VAL_CSV
    if inside in files:
        with member_reader(_spans(path, archive, infos, [files[inside]])) as read:
            data = read(0, f"{path.name}/{inside}")
        return label_flat_val(path.parent, shown, path / inside, index, data)
    beside = path.parent / VAL_CSV
    if is_source_file(beside):
        return label_flat_val(path.parent, shown, beside, index)
    raise DatasetError(
        f"{path}: flat val but no {VAL_CSV} in the zip or beside it; put it beside the zip, or pack only train (--splits train)"
    )
