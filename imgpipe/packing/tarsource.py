"""Scan image-net.org's tarballs in place: member offsets inside the tar, no extraction.

A tarball source holds ``ILSVRC2012_img_train.tar`` (one ``<wnid>.tar`` per class inside),
``ILSVRC2012_img_val.tar`` (flat ``ILSVRC2012_val_%08d.JPEG``) and the val labels: the
devkit ``ILSVRC2012_devkit_t12.tar.gz`` or Kaggle's ``LOC_val_solution.csv``. Items are the
same as those of the extracted tree, in the same order and with the same labels, so a pack
from the tars is byte-identical to a pack of the extracted folders. Each item is a
(byte offset, size) span of the outer tar, kept in numpy arrays; workers read it with one
``pread``. Its source path names the member: ``ILSVRC2012_img_train.tar/n01440764.tar/
n01440764_10026.JPEG``, relative to the source root (the folder holding the tars).

Python's ``tarfile`` stops quietly at a header it cannot parse after the first one, which
is how a truncated download looks; the listing therefore also requires the end-of-archive
zero block and every member's data inside the file, and names the tar and the member where
the damage starts.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from imgpipe._sys.procs import map_in_processes
from imgpipe.packing.devkit import DEVKIT_NAME, META, Devkit, can_read_meta, read_devkit
from imgpipe._sys.distenv import available_cpus
from imgpipe._sys.oserrors import describe
from imgpipe.errors import DatasetError
from imgpipe.format.manifest import stays_inside_source_root
from imgpipe.packing.source import NEWLINE_REASON, VAL_CSV, SourceTree, SplitItems, is_image_name, label_flat_val, read_val_csv

logger = logging.getLogger(__name__)

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
BLOCK = 512
ESCAPE_REASON = "member name is absolute or climbs out with '..'"


@dataclass(frozen=True)
class TarFiles:
    """The files of a tarball source; paths of items are relative to ``root``."""

    root: Path
    train: Path | None = None
    val: Path | None = None
    devkit: Path | None = None
    val_csv: Path | None = None


@dataclass(frozen=True)
class MemberSpans:
    """Where items lie in one archive: the absolute offset and the size of each member's data."""

    archive: Path
    offsets: np.ndarray  # int64
    sizes: np.ndarray  # int64

    def take(self, index: np.ndarray | slice) -> "MemberSpans":
        return MemberSpans(self.archive, self.offsets[index], self.sizes[index])

    def read(self, fd: int, k: int, name: str) -> bytes:
        """Item ``k``'s bytes from the open archive ``fd``; a short read means the tar shrank since the scan."""
        size = int(self.sizes[k])
        data = os.pread(fd, size, int(self.offsets[k]))
        if len(data) != size:
            raise DatasetError(
                f"{name}: the tar ends inside this member ({len(data)} of {size} bytes); it changed since the scan: "
                f"download it again and rerun (finished shards are kept)"
            )
        return data


@dataclass
class _Listing:
    """Image members of one tar in ImageFolder order, with their absolute spans."""

    names: list[str]
    offsets: np.ndarray
    sizes: np.ndarray
    rejected: list[tuple[str, str]] = field(default_factory=list)
    ignored: int = 0


def find_tars(src: str | os.PathLike | Sequence[str | os.PathLike]) -> TarFiles | None:
    """The tarball source SRC names, or None when SRC is a folder of a folder layout.

    SRC is a folder holding the image-net.org files by their names (used only when it has
    no ``train/`` or Kaggle folders), one ``.tar``, or several files named one by one.
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
    train, val = root / TRAIN_TAR, root / VAL_TAR
    if not (train.is_file() or val.is_file()):
        return None
    return TarFiles(root, train if train.is_file() else None, val if val.is_file() else None, *_labels_beside(root))


def _labels_beside(folder: Path) -> tuple[Path | None, Path | None]:
    devkit, csv = folder / DEVKIT_NAME, folder / VAL_CSV
    return (devkit if devkit.is_file() else None), (csv if csv.is_file() else None)


def _classify(paths: list[Path]) -> TarFiles:
    """Sort files named one by one into train tar, val tar, devkit and val CSV."""
    roles: dict[str, Path] = {}
    for path in paths:
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "no such file"
            raise DatasetError(f"{path}: {what}; among several SRCs name only the train tar, the val tar, the devkit or {VAL_CSV}")
        name = path.name.lower()
        if name.endswith((".tar.gz", ".tgz")):
            role = "devkit"
        elif name.endswith(".csv"):
            role = "val_csv"
        elif name.endswith(".tar"):
            role = "train" if _holds_tars(path) else "val"
        else:
            raise DatasetError(f"{path}: not a .tar, a devkit .tar.gz or {VAL_CSV}; give a folder or the image-net.org files")
        if role in roles:
            raise DatasetError(f"{path}: a second {role.replace('_', ' ')} (the first is {roles[role]}); name each file once")
        roles[role] = path
    if "train" not in roles and "val" not in roles:
        raise DatasetError(f"{paths[0]}: no train or val tar among the files named; give {TRAIN_TAR} or {VAL_TAR}")
    if "val" in roles and "devkit" not in roles and "val_csv" not in roles:
        beside = _labels_beside(roles["val"].parent)
        roles.update({k: v for k, v in zip(("devkit", "val_csv"), beside) if v is not None})
    root = Path(os.path.commonpath([p.parent for p in roles.values()]))
    return TarFiles(root, **roles)


def _holds_tars(path: Path) -> bool:
    """True when the first file member of the tar at ``path`` is itself a .tar (a train tar)."""
    try:
        with tarfile.open(path, "r:") as archive:
            for member in archive:
                if member.isreg():
                    return member.name.endswith(".tar")
    except OSError as e:
        if e.errno is None:
            raise DatasetError(f"{path}: not a readable tar ({e}); download it again") from None
        raise DatasetError(f"{path}: cannot read it: {describe(e, writing=False)}") from None
    except tarfile.TarError as e:
        raise DatasetError(f"{path}: not a readable tar ({e}); download it again") from None
    return False


def scan_tars(tars: TarFiles, splits: Sequence[str] | None, workers: int | None = None) -> SourceTree:
    """The classes and items of a tarball source, like ``source.scan`` gives for the extracted tree."""
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
    tree = SourceTree(root=tars.root, layout="tarballs", classes=classes)
    for split in wanted:
        if split == "train" and tars.train is not None and class_tars is not None:
            tree.splits[split] = _scan_train(tars.train, tars.root, class_tars, index, workers)
        elif tars.val is not None:
            tree.splits[split] = _scan_val(tars.val, tars, devkit, index)
        logger.info("%s: %d images in %s", split, len(tree.splits[split]), found[split])
    return tree


@contextlib.contextmanager
def _open(path: Path) -> Iterator[int]:
    """A read-only file descriptor of ``path``; a file that cannot be opened is a DatasetError."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise DatasetError(f"{path}: cannot open it: {describe(e, writing=False)}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _class_tars(archive: Path) -> dict[str, tuple[int, int]]:
    """wnid -> (offset, size) of each ``<wnid>.tar`` member of the train tar."""
    found: dict[str, tuple[int, int]] = {}
    ignored = 0
    with _open(archive) as fd:
        members = _members(fd, 0, os.fstat(fd).st_size, str(archive), archive.name)
    for name, offset, size in members:
        if "/" in name or not name.endswith(".tar") or name.startswith("."):
            ignored += 1
            continue
        wnid = name[: -len(".tar")]
        if wnid in found:
            raise DatasetError(f"{archive}: {name} is in the tar twice; download {TRAIN_TAR} again")
        found[wnid] = (offset, size)
    if ignored:
        logger.info("%s: ignored %d members that are not class tars", archive, ignored)
    if not found:
        raise DatasetError(f"{archive}: no <wnid>.tar class tars inside; is this {TRAIN_TAR}?")
    return found


def _scan_train(
    archive: Path, root: Path, class_tars: dict[str, tuple[int, int]], index: dict[str, int], workers: int | None
) -> SplitItems:
    """List every class tar of the train tar, in parallel; labels by sorted wnid."""
    wnids = sorted(class_tars)
    base = archive.relative_to(root).as_posix()
    tasks = [(archive, *class_tars[wnid], f"{base}/{wnid}.tar", root) for wnid in wnids]
    processes = min(workers or available_cpus(), len(tasks))
    if processes <= 1:
        listings = [_list_images(*task) for task in tasks]
    else:
        listings = list(map_in_processes(_list_images_task, tasks, workers=processes, chunksize=max(1, len(tasks) // (8 * processes))))
    for wnid, listing in zip(wnids, listings):
        if not listing.names:
            logger.warning("%s/%s.tar: class tar has no images; its label %d stays reserved", archive, wnid, index[wnid])
    return _items(listings, [np.full(len(listing.names), index[wnid], np.int32) for wnid, listing in zip(wnids, listings)], archive)


def _scan_val(archive: Path, tars: TarFiles, devkit: Devkit | None, index: dict[str, int]) -> SplitItems:
    """List the flat val tar; labels from the devkit, else from the val CSV."""
    listing = _list_images(archive, 0, archive.stat().st_size, archive.relative_to(tars.root).as_posix(), tars.root)
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


def _items(listings: list[_Listing], labels: list[np.ndarray], archive: Path) -> SplitItems:
    names = [name for listing in listings for name in listing.names]
    spans = MemberSpans(
        archive,
        np.concatenate([listing.offsets for listing in listings]) if listings else np.zeros(0, np.int64),
        np.concatenate([listing.sizes for listing in listings]) if listings else np.zeros(0, np.int64),
    )
    ignored = sum(listing.ignored for listing in listings)
    if ignored:
        logger.info("%s: ignored %d members without an image extension", archive, ignored)
    rejected = [r for listing in listings for r in listing.rejected]
    return SplitItems(names, np.concatenate(labels) if labels else np.zeros(0, np.int32), rejected, spans)


def _list_images_task(task: tuple[Path, int, int, str, Path]) -> _Listing:
    return _list_images(*task)


def _list_images(archive: Path, start: int, size: int, prefix: str, root: Path) -> _Listing:
    """The image members of the tar at [start, start + size) of ``archive``, as ``prefix/name``
    (``prefix`` relative to ``root``), sorted as ImageFolder sorts."""
    found: list[tuple[str, int, int]] = []
    rejected: list[tuple[str, str]] = []
    ignored = 0
    with _open(archive) as fd:
        for name, offset, length in _members(fd, start, size, str(root / prefix), archive.name):
            path = f"{prefix}/{name}"
            if not stays_inside_source_root(name):
                rejected.append((path, ESCAPE_REASON))
            elif any(part.startswith(".") for part in name.split("/")):
                continue
            elif not is_image_name(name):
                ignored += 1
            elif "\n" in name:
                rejected.append((path, NEWLINE_REASON))
            else:
                found.append((path, offset, length))
    for path, reason in rejected:
        logger.warning("%s: %r left out: %s", prefix, path, reason)
    found.sort(key=lambda item: item[0].rpartition("/")[::2])
    return _Listing(
        [path for path, _, _ in found],
        np.array([offset for _, offset, _ in found], np.int64),
        np.array([length for _, _, length in found], np.int64),
        rejected,
        ignored,
    )


def _members(fd: int, start: int, size: int, where: str, download: str) -> list[tuple[str, int, int]]:
    """(name, absolute data offset, size) of each regular member of the tar at [start, start + size) of ``fd``.

    Raises a DatasetError naming ``where`` and the last good member when the tar is truncated or
    corrupt, and saying to download ``download`` (the file holding it) again.
    """
    window = _Window(fd, start, size)
    members: list[tuple[str, int, int]] = []
    last = "its first member"
    try:
        with tarfile.TarFile(fileobj=window, mode="r") as archive:  # type: ignore[arg-type]
            while (member := archive.next()) is not None:
                if member.offset_data + member.size > size:
                    raise DatasetError(_broken(where, f"ends inside member {_clean(member.name)}", download))
                if member.isreg():
                    if member.sparse is not None:
                        raise DatasetError(f"{where}: member {member.name} is a sparse file; ImageNet tars have none: download {download} again")
                    members.append((_clean(member.name), start + member.offset_data, member.size))
                last = f"member {_clean(member.name)}"
                archive.members.clear()  # memory stays flat: the names are kept here, not as TarInfo objects
            end = archive.offset
    except tarfile.TarError as e:
        raise DatasetError(_broken(where, f"{e} after {last}", download)) from None
    tail = os.pread(fd, BLOCK, start + end) if end + BLOCK <= size else b""
    if len(tail) < BLOCK:
        raise DatasetError(_broken(where, f"ends after {last} without the end-of-archive block", download))
    if tail.count(0) != BLOCK:
        raise DatasetError(_broken(where, f"unreadable header at byte {end} after {last}", download))
    return members


def _broken(where: str, what: str, download: str) -> str:
    return f"{where}: truncated or corrupt tar: {what}; download {download} again and rerun"


def _clean(name: str) -> str:
    """A member name without the ``./`` prefix ``tar -C dir .`` writes."""
    while name.startswith("./"):
        name = name[2:]
    return name


class _Window(io.RawIOBase):
    """Bytes [start, start + size) of ``fd`` as a read-only file, read with ``pread`` (no shared file position)."""

    def __init__(self, fd: int, start: int, size: int) -> None:
        self.fd, self.start, self.size, self.position = fd, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        count = max(0, min(len(buffer), self.size - self.position))
        data = os.pread(self.fd, count, self.start + self.position) if count else b""
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position
