"""Scan image-net.org's tarballs in place: member offsets inside the tar, no extraction.

Items are the extracted tree's, in its order and with its labels, so the shards are byte-identical to
the tree's; each is a (byte offset, size) span of the outer tar, read with one ``pread``. The train tar
may come in parts (``split-tar``, ``members.ArchiveFile``). Items are its regular members, the last of a
repeated name as extraction keeps it (``regular_members``: a link or a device is listed as skipped).
Python's ``tarfile`` stops quietly at a header it cannot parse, which is how a truncated download
looks, so the listing also requires the end-of-archive block and every member's data inside the file,
and names the tar and the member where the damage starts.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.oserrors import describe
from imgpipe._sys.procs import map_in_processes
from imgpipe.errors import DatasetError
from imgpipe.format.manifest import stays_inside_source_root
from imgpipe.ingest.devkit import DEVKIT_NAME, META, Devkit, can_read_meta, read_devkit
from imgpipe.ingest.filekinds import is_source_file, tar_reason
from imgpipe.ingest.folders import (
    NEWLINE_REASON,
    VAL_CSV,
    SourceTree,
    SplitItems,
    is_image_name,
    label_flat_val,
    match_archive_name,
    read_val_csv,
    warn_left_out,
)
from imgpipe.ingest.members import ArchiveFile, MemberSpans, OpenArchive
from imgpipe.ingest.tarwalk import BLOCK, TarEntry, TarfileWalk, TarWalk, Unsupported, open_tarfile, walk_file

logger = logging.getLogger(__name__)

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
ESCAPE_REASON = "member name is absolute or climbs out with '..'"
KEEP, HIDDEN, NOT_AN_IMAGE = "keep", "hidden", "not an image"  # classify_member's answers other than a reason to report


@dataclass(frozen=True)
class TarFiles:
    """The files of a tarball source; paths of items are relative to ``root``."""

    root: Path
    train: ArchiveFile | None = None
    val: ArchiveFile | None = None
    devkit: Path | None = None
    val_csv: Path | None = None

    @property
    def layout(self) -> str:
        return "split-tar" if self.train is not None and len(self.train.parts) > 1 else "tarballs"


@dataclass
class _Listing:
    """Image members of one tar in ImageFolder order, with their spans."""

    names: list[str]
    offsets: np.ndarray
    sizes: np.ndarray
    rejected: list[tuple[str, str]] = field(default_factory=list)
    ignored: int = 0


def classify_member(name: str, rest: str) -> str:
    """How the archive member ``name`` (``rest``: its part below the folder being listed) is listed: ``KEEP``,
    ``HIDDEN`` (a name or folder starting with '.': left out silently), ``NOT_AN_IMAGE`` (counted as ignored),
    or the reason it is left out and reported (a name that escapes SRC or cannot be stored)."""
    if not stays_inside_source_root(name):
        return ESCAPE_REASON
    if any(part.startswith(".") for part in rest.split("/")):
        return HIDDEN
    if not is_image_name(name):
        return NOT_AN_IMAGE
    if "\n" in name:
        return NEWLINE_REASON
    return KEEP


def find_tars(src: str | os.PathLike | Sequence[str | os.PathLike]) -> TarFiles | None:
    """The tarball source SRC names, or None when SRC is a folder of a folder layout.

    SRC is a folder holding the image-net.org files by their names (used only when it has
    no ``train/`` or Kaggle folders), one ``.tar``, or several files named one by one. The
    train tar may be cut into parts, ``ILSVRC2012_img_train.tar.001``, ``.002``, ...
    """
    if isinstance(src, (str, os.PathLike)):
        path = Path(os.path.abspath(src))
        if path.is_dir():
            return _tars_in_folder(path)
        return _classify([path]) if path.exists() else None
    return _classify([Path(os.path.abspath(p)) for p in src])


def _tars_in_folder(root: Path) -> TarFiles | None:
    if (root / "train").is_dir() or (root / "ILSVRC").is_dir():
        return None
    val = root / VAL_TAR
    train = ArchiveFile.of(root / TRAIN_TAR) if is_source_file(root / TRAIN_TAR) else _parts_in_folder(root, TRAIN_TAR)
    has_val = is_source_file(val)
    if train is None and not has_val:
        return None
    return TarFiles(root, train, ArchiveFile.of(val) if has_val else None, *_labels_beside(root))


def _parts_in_folder(root: Path, name: str) -> ArchiveFile | None:
    """``root/name.001``, ``.002``, ... as one archive, or None when there are none."""
    part_name = re.compile(re.escape(name) + r"\.[0-9]+")
    parts = [p for p in root.glob(f"{name}.*") if match_archive_name(part_name, p) and is_source_file(p)]
    return _joined_parts(parts) if parts else None


def _joined_parts(parts: list[Path]) -> ArchiveFile:
    """The parts of one split file in numeric order; a gap in the numbers is a DatasetError."""
    parts = sorted(parts, key=lambda p: (int(p.suffix[1:]), p.name))
    numbers = [int(p.suffix[1:]) for p in parts]
    twice = next((k for k in range(1, len(parts)) if numbers[k] == numbers[k - 1]), None)
    if twice is not None:
        first, second = parts[twice - 1], parts[twice].name
        raise DatasetError(f"{first} and {second} are both part {numbers[twice]} of {parts[0].stem}; keep one of them")
    missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
    if numbers[0] > 1 or missing:
        gap = missing[0] if missing else 1
        raise DatasetError(f"{parts[0].with_suffix('')}: part .{gap:0{len(parts[0].suffix) - 1}d} is missing; download every part")
    return ArchiveFile(tuple(parts))


def _labels_beside(folder: Path) -> tuple[Path | None, Path | None]:
    devkit, csv = folder / DEVKIT_NAME, folder / VAL_CSV
    return (devkit if is_source_file(devkit) else None), (csv if is_source_file(csv) else None)


def _classify(paths: list[Path]) -> TarFiles:
    """Sort files named one by one into train tar (or its parts), val tar, devkit and val CSV."""
    roles: dict[str, Path] = {}
    parts: list[Path] = []
    for path in paths:
        if not is_source_file(path):
            what = "is a folder" if path.is_dir() else "no such file"
            raise DatasetError(f"{path}: {what}; among several SRCs name only the train tar, the val tar, the devkit or {VAL_CSV}")
        name = path.name.lower()
        if name.endswith((".tar.gz", ".tgz")):
            role = "devkit"
        elif name.endswith(".csv"):
            role = "val_csv"
        elif name.endswith(".tar"):
            role = "train" if _holds_tars(ArchiveFile.of(path)) else "val"
        elif re.fullmatch(r"\.[0-9]+", path.suffix) and path.stem.lower().endswith(".tar"):
            parts.append(path)
            continue
        else:
            raise DatasetError(f"{path}: not a .tar, a devkit .tar.gz or {VAL_CSV}; give a folder or the image-net.org files")
        if role in roles:
            raise DatasetError(f"{path}: a second {role.replace('_', ' ')} (the first is {roles[role]}); name each file once")
        roles[role] = path
    if parts:
        if "train" in roles or len({p.with_suffix("") for p in parts}) > 1:
            raise DatasetError(f"{parts[0]}: parts of more than one train tar; name the parts of one tar, or the tar itself")
        train: ArchiveFile | None = _joined_parts(parts)
    else:
        train = ArchiveFile.of(roles["train"]) if "train" in roles else None
    if train is None and "val" not in roles:
        raise DatasetError(f"{paths[0]}: no train or val tar among the files named; give {TRAIN_TAR} or {VAL_TAR}")
    if "val" in roles and "devkit" not in roles and "val_csv" not in roles:
        beside = _labels_beside(roles["val"].parent)
        roles.update({k: v for k, v in zip(("devkit", "val_csv"), beside) if v is not None})
    root = Path(os.path.commonpath([p.parent for p in [*roles.values(), *parts]]))
    val = ArchiveFile.of(roles["val"]) if "val" in roles else None
    return TarFiles(root, train, val, roles.get("devkit"), roles.get("val_csv"))


def _holds_tars(archive: ArchiveFile) -> bool:
    """True when the first file member of the tar is itself a .tar (a train tar)."""
    if archive.size() == 0:
        raise DatasetError(f"{archive}: an empty file (0 bytes), not a tar; download it again")
    try:
        with OpenArchive(archive) as source, open_tarfile(Window(source, 0, source.size)) as tar:  # type: ignore[arg-type]
            for member in tar:
                if member.isreg():
                    return member.name.endswith(".tar")
    except OSError as e:
        if e.errno is None:
            raise DatasetError(f"{archive}: not a readable tar ({e}); download it again") from None
        raise DatasetError(f"{archive}: cannot read it: {describe(e, writing=False)}") from None
    except tarfile.TarError as e:
        raise DatasetError(f"{archive}: not a readable tar ({e}); download it again") from None
    return False


def scan_tars(tars: TarFiles, splits: Sequence[str] | None, workers: int | None = None) -> SourceTree:
    """The classes and items of a tarball source, like ``folders.scan_folders`` gives for the extracted tree."""
    found = {name: path for name, path in (("train", tars.train), ("val", tars.val)) if path is not None}
    wanted = list(found) if splits is None else list(dict.fromkeys(splits))
    missing = [s for s in wanted if s not in found]
    if missing:
        raise DatasetError(f"{tars.root}: split {', '.join(map(repr, missing))} not found (these tars hold: {', '.join(found)})")
    devkit = None
    if "val" in wanted:
        if tars.devkit is None and tars.val_csv is None:
            raise DatasetError(
                f"{tars.val}: no val labels: put {DEVKIT_NAME} (or Kaggle's {VAL_CSV}) beside it, or pack only train (--splits train)"
            )
        if tars.devkit is not None and tars.val_csv is not None and not can_read_meta():
            logger.info("labelling val from %s: the devkit's %s needs scipy, which is not installed", tars.val_csv, META)
        elif tars.devkit is not None:
            devkit = read_devkit(tars.devkit)
    class_tars = _class_tars(tars.train) if tars.train is not None else None
    if class_tars is not None:
        classes = sorted(class_tars)
    elif devkit is not None:
        classes = devkit.wnids
    else:
        classes = sorted({wnid for wnid, _ in read_val_csv(tars.val_csv).values()})  # type: ignore[arg-type]
    index = {name: i for i, name in enumerate(classes)}
    tree = SourceTree(root=tars.root, layout=tars.layout, classes=classes)
    for split in wanted:
        if split == "train" and tars.train is not None and class_tars is not None:
            tree.splits[split] = _scan_train(tars.train, tars.root, class_tars, index, workers)
        elif tars.val is not None:
            tree.splits[split] = _scan_val(tars.val, tars, devkit, index)
        logger.info("%s: %d images in %s", split, len(tree.splits[split]), found[split])
    return tree


def _class_tars(archive: ArchiveFile) -> dict[str, tuple[int, int]]:
    """wnid -> (offset, size) of each ``<wnid>.tar`` member of the train tar (the last of a repeated name, as extraction keeps)."""
    found: dict[str, tuple[int, int]] = {}
    ignored = 0
    with OpenArchive(archive) as source:
        members, _ = regular_members(list_tar(source, 0, source.size, str(archive), archive.name))
    for name, offset, size, *_ in members:
        if "/" in name or not name.endswith(".tar") or name.startswith("."):
            ignored += 1
            continue
        found[name[: -len(".tar")]] = (offset, size)
    if ignored:
        logger.info("%s: ignored %d members that are not class tars", archive, ignored)
    if not found:
        raise DatasetError(f"{archive}: no <wnid>.tar class tars inside; is this {TRAIN_TAR}?")
    return found


def _scan_train(
    archive: ArchiveFile, root: Path, class_tars: dict[str, tuple[int, int]], index: dict[str, int], workers: int | None
) -> SplitItems:
    """List every class tar of the train tar, in parallel; labels by sorted wnid."""
    wnids = sorted(class_tars)
    tasks = [(archive, *class_tars[wnid], f"{archive.name}/{wnid}.tar", root) for wnid in wnids]
    processes = min(workers or available_cpus(), len(tasks))
    if processes <= 1:
        listings = [_list_images(*task) for task in tasks]
    else:
        listings = list(map_in_processes(_list_images_task, tasks, workers=processes, chunksize=max(1, len(tasks) // (8 * processes))))
    for wnid, listing in zip(wnids, listings):
        if not listing.names:
            logger.warning("%s/%s.tar: class tar has no images; its label %d stays reserved", archive, wnid, index[wnid])
    return _items(listings, [np.full(len(listing.names), index[wnid], np.int32) for wnid, listing in zip(wnids, listings)], archive)


def _scan_val(archive: ArchiveFile, tars: TarFiles, devkit: Devkit | None, index: dict[str, int]) -> SplitItems:
    """List the flat val tar; labels from the devkit, else from the val CSV."""
    listing = _list_images(archive, 0, archive.size(), archive.name, tars.root)
    if devkit is not None:
        labels = np.empty(len(listing.names), np.int32)
        for k, name in enumerate(listing.names):
            wnid = devkit.val_wnid(name)
            if wnid not in index:
                raise DatasetError(f"{tars.root / name}: devkit class {wnid!r} is not one of the {len(index)} train classes")
            labels[k] = index[wnid]
    else:
        labels = label_flat_val(tars.root, listing.names, tars.val_csv, index)  # type: ignore[arg-type]
    return _items([listing], [labels], archive)


def _items(listings: list[_Listing], labels: list[np.ndarray], archive: ArchiveFile) -> SplitItems:
    names = [name for listing in listings for name in listing.names]
    join = lambda arrays, dtype: np.concatenate(arrays) if arrays else np.zeros(0, dtype)  # noqa: E731
    spans = MemberSpans.of(archive, join([x.offsets for x in listings], np.int64), join([x.sizes for x in listings], np.int64))
    ignored = sum(listing.ignored for listing in listings)
    if ignored:
        logger.info("%s: ignored %d members without an image extension", archive, ignored)
    rejected = [r for listing in listings for r in listing.rejected]
    return SplitItems(names, np.concatenate(labels) if labels else np.zeros(0, np.int32), rejected, spans)


def _list_images_task(task: tuple[ArchiveFile, int, int, str, Path]) -> _Listing:
    return _list_images(*task)


def _list_images(archive: ArchiveFile, start: int, size: int, prefix: str, root: Path) -> _Listing:
    """The image members of the tar at [start, start + size) of ``archive``, as ``prefix/name``
    (``prefix`` relative to ``root``), sorted as ImageFolder sorts, as extraction would leave them."""
    with OpenArchive(archive) as source:
        members, irregular = regular_members(list_tar(source, start, size, str(root / prefix), archive.name))
    found: list[tuple[str, int, int]] = []
    ignored = 0
    rejected: list[tuple[str, str]] = []
    for name, offset, length, *_ in members:
        path = f"{prefix}/{name}"
        fate = classify_member(name, name)
        if fate == KEEP:
            found.append((path, offset, length))
        elif fate == NOT_AN_IMAGE:
            ignored += 1
        elif fate != HIDDEN:
            rejected.append((path, fate))
    for name, reason in irregular:
        fate = classify_member(name, name)
        if fate not in (HIDDEN, NOT_AN_IMAGE):
            rejected.append((f"{prefix}/{name}", reason if fate == KEEP else fate))
    for path, reason in rejected:
        warn_left_out(prefix, path[len(prefix) + 1 :], reason)
    found.sort(key=lambda item: item[0].rpartition("/")[::2])
    return _Listing(
        [path for path, *_ in found],
        np.array([offset for _, offset, _ in found], np.int64),
        np.array([length for *_, length in found], np.int64),
        rejected,
        ignored,
    )


def regular_members(entries: list[TarEntry]) -> tuple[list[TarEntry], list[tuple[str, str]]]:
    """The regular members of ``entries`` (the last of a repeated name, as extraction keeps it), and (name, reason)
    of each other member that is not a folder: a link, a device or a FIFO is listed, never read (as webdataset skips it)."""
    last: dict[str, TarEntry] = {}
    for entry in entries:
        if entry.type != tarfile.DIRTYPE:
            last[entry.name] = entry
    members, irregular = [], []
    for entry in last.values():
        reason = tar_reason(entry)
        if reason is None:
            members.append(entry)
        else:
            irregular.append((entry.name, reason))
    return members, irregular


def list_tar(source: OpenArchive, start: int, size: int, where: str, download: str) -> list[TarEntry]:
    """Every member of the tar at [start, start + size) of ``source``, in order, with absolute data offsets.

    Raises a DatasetError naming ``where`` and the last good member when the tar is truncated or
    corrupt, and saying to download ``download`` (the file holding it) again. Plain headers are
    walked by ``tarwalk``; a tar with any other kind is read by ``tarfile`` instead.
    """
    if size == 0:
        raise DatasetError(f"{where}: an empty file (0 bytes), not a tar; download {_holding(source, download, start)} again and rerun")
    try:
        return _listed(walk_file(Window(source, start, size), plain=True), source, start, size, where, download)
    except Unsupported:
        return _listed(walk_file(Window(source, start, size), plain=False), source, start, size, where, download)


def _listed(walk: TarWalk | TarfileWalk, source: OpenArchive, start: int, size: int, where: str, download: str) -> list[TarEntry]:
    members: list[TarEntry] = []
    last = "its first member"
    following = 0  # where the header after the last member read starts, inside the tar
    try:
        for member in walk:
            name = _clean(member.name)
            if member.type == tarfile.GNUTYPE_SPARSE:  # its size is the file's, not the bytes stored: before the check on it
                raise DatasetError(
                    f"{where}: member {name} is stored as a sparse file (GNU tar -S), which pack does not read in place "
                    f"(ImageNet's tars hold none): download {download} again, or make it without -S"
                )
            if member.offset + member.size > size:
                raise DatasetError(_broken(where, f"ends inside member {name}", _holding(source, download, start + size)))
            members.append(TarEntry(name, start + member.offset, member.size, member.type, member.linkname))
            last = f"member {name}"
            following = member.offset + (-(-member.size // BLOCK) * BLOCK if member.type in tarfile.REGULAR_TYPES else 0)
    except tarfile.TarError as e:
        raise DatasetError(_broken(where, f"{e} after {last}", _holding(source, download, start + following))) from None
    end = walk.end
    tail = source.pread(BLOCK, start + end) if end + BLOCK <= size else b""
    if len(tail) < BLOCK:
        raise DatasetError(_broken(where, f"ends after {last} without the end-of-archive block", _holding(source, download, start + size)))
    if tail.count(0) != BLOCK:
        raise DatasetError(_broken(where, f"unreadable header at byte {end} after {last}", _holding(source, download, start + end)))
    return members


def _broken(where: str, what: str, download: str) -> str:
    return f"{where}: truncated or corrupt tar: {what}; download {download} again and rerun"


def _holding(source: OpenArchive, download: str, at: int) -> str:
    """What to download again for damage found at byte ``at``: the part holding it (the last, where the
    archive ends early) when the archive is cut into parts, else ``download``."""
    parts = source.archive.parts
    if len(parts) == 1:
        return download
    return parts[max(0, int(np.searchsorted(source.starts, min(at, source.size - 1), side="right")) - 1)].name


def _clean(name: str) -> str:
    """A member name without the ``./`` prefix ``tar -C dir .`` writes (and without a folder's trailing ``/``)."""
    while name.startswith("./"):
        name = name[2:]
    return name


class Window(io.RawIOBase):
    """Bytes [start, start + size) of an open archive as a read-only file, read with ``pread`` (no shared file position)."""

    def __init__(self, source: OpenArchive, start: int, size: int) -> None:
        self.source, self.start, self.size, self.position = source, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (the rest of the window if negative) with one ``pread``, no buffer copy."""
        left = max(0, self.size - self.position)
        count = left if size is None or size < 0 else min(size, left)
        data = self.source.pread(count, self.start + self.position) if count else b""
        self.position += len(data)
        return data

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position
