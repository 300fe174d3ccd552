"""Find the images and labels of a source tree: ImageNet, the Kaggle download, or class folders.

The layouts (``SourceTree.layout``: ``imagenet``, ``kaggle``, ``imagenet21k-p``, ``class-folders``; the
archive layouts are ``layouts``' and ``scan``'s) and how each is labelled are in docs/cli.md. Items come
in ImageFolder's order (classes by plain ``sorted()``; class, folder, file; val by file name), as posix
paths relative to ``SourceTree.root``, kept as a ``list[str]`` and an int32 label array; a path the
sidecars cannot hold (a newline, not UTF-8) is left out and listed in ``SplitItems.rejected``. Only
``os.scandir`` is used, with no per-file ``stat``.
"""

from __future__ import annotations

import codecs
import csv
import io
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from imgpipe.errors import DatasetError
from imgpipe.ingest.filekinds import is_folder, is_source_file

if TYPE_CHECKING:
    from imgpipe.ingest.members import MemberSpans
    from imgpipe.ingest.streams import StreamItems

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpeg", ".jpg", ".jpe", ".jfif", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm"})
VAL_CSV = "LOC_val_solution.csv"
NEWLINE_REASON = "file name contains a newline (the sources sidecar is one path per line); rename the file"
NOT_UTF8_REASON = "file or folder name is not valid UTF-8 (the manifest and the sidecars are UTF-8); rename it"
KAGGLE_DATA = ("ILSVRC", "Data", "CLS-LOC")
IN21K_P = {"train": "imagenet21k_train", "val": "imagenet21k_val"}  # ImageNet-21K-P's split folders
IN21K_P_SMALL = "imagenet21k_small_classes"  # beside them: the classes ImageNet-21K-P leaves out
IN21K_P_DOWNLOAD = "imagenet21k_resized"  # the folder image-net.org's ImageNet-21K-P download holds them in
NEVER_CLASSES = {  # folder names of the layouts above, never a class: what each is, and what to do
    "test": "ImageNet's test images, which carry no labels; give the folder that holds train/ or val/",
    IN21K_P_DOWNLOAD: f"the folder ImageNet-21K-P's download unpacks to; give it as SRC (it holds {IN21K_P['train']}/)",
    KAGGLE_DATA[0]: f"the Kaggle download without {'/'.join(KAGGLE_DATA[1:])}/ inside; extract its train/ and val/ there",
    **{name: f"part of the Kaggle download; give the folder that holds {KAGGLE_DATA[0]}/ as SRC"
       for name in (*KAGGLE_DATA[1:], "Annotations", "ImageSets")},
}  # fmt: skip
SPLIT_FOLDERS = frozenset({"train", "val", *IN21K_P.values(), IN21K_P_SMALL, IN21K_P_DOWNLOAD, KAGGLE_DATA[0]})  # never inside a split
ACCEPTED_LAYOUTS = (
    "SRC/train/<wnid>/* and/or SRC/val/ (class folders, or flat with LOC_val_solution.csv); "
    "the Kaggle download SRC/ILSVRC/Data/CLS-LOC/{train,val} with SRC/LOC_val_solution.csv; "
    "ImageNet-21K-P's SRC/imagenet21k_train/<wnid>/* and/or SRC/imagenet21k_val/<wnid>/*; "
    "or SRC/<class>/* class folders"
)


@dataclass
class SplitItems:
    """The files of one split in pack order: posix paths relative to the root and their labels."""

    paths: list[str]
    labels: np.ndarray  # int32, one per path
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (path, reason) of files left out
    spans: MemberSpans | StreamItems | None = None  # where each item lies in an archive (archive layouts); None: files

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class SourceTree:
    """A scanned source: its layout, the classes in label order and the items of each split."""

    root: Path
    layout: str
    classes: list[str]
    splits: dict[str, SplitItems] = field(default_factory=dict)


def scan_folders(src: str | os.PathLike, splits: Sequence[str] | None = None) -> SourceTree:
    """Scan the folder tree ``src`` for the requested splits (all found when None); a DatasetError says what is wrong."""
    root = Path(os.path.abspath(src))
    if not root.is_dir():
        raise DatasetError(f"{src}: source folder not found")
    layout, split_dirs = _detect_layout(root)
    wanted = list(split_dirs) if splits is None else list(dict.fromkeys(splits))
    missing = [s for s in wanted if s not in split_dirs]
    if missing:
        raise DatasetError(
            f"{root}: split {', '.join(map(repr, missing))} not found (this {layout} source has: {', '.join(split_dirs) or 'none'})"
        )
    classes = _classes(root, split_dirs)
    index = {name: i for i, name in enumerate(classes)}
    tree = SourceTree(root=root, layout=layout, classes=classes)
    for split in wanted:
        folder = split_dirs[split]
        if split == "val" and not _subdirs(folder):
            tree.splits[split] = _scan_flat_val(root, folder, index)
        else:
            tree.splits[split] = _scan_class_folders(root, folder, index, split)
        logger.info("%s: %d images in %s", split, len(tree.splits[split]), folder)
    return tree


def _detect_layout(root: Path) -> tuple[str, dict[str, Path]]:
    """The layout name and the folder of each split it has. A folder name that belongs to a layout is never a class:
    a layout with a split missing is packed with the splits it has, or is one line saying what is missing."""
    kaggle = next((root.joinpath(*KAGGLE_DATA[k:]) for k in range(3) if root.joinpath(*KAGGLE_DATA[k:]).is_dir()), None)
    if kaggle is not None:  # SRC holds ILSVRC/, or is ILSVRC/ or ILSVRC/Data/
        found = {s: kaggle / s for s in ("train", "val") if (kaggle / s).is_dir()}
        if not found:
            raise DatasetError(f"{kaggle}: no train/ or val/ inside; extract them there from the Kaggle download")
        return "kaggle", _with_class_folders(found, "train")
    if (root / IN21K_P["train"]).is_dir():
        return "imagenet21k-p", _in21k_p(root)
    if (root / "train").is_dir():
        found = {s: root / s for s in ("train", "val") if (root / s).is_dir()}
        return "imagenet", _with_class_folders(found, "train")
    if (root / IN21K_P["val"]).is_dir():  # the train folder not extracted yet: val alone
        return "imagenet21k-p", _alone(root, IN21K_P["val"], _in21k_p(root))
    if (root / IN21K_P_SMALL).is_dir():
        raise DatasetError(
            f"{root / IN21K_P_SMALL}: the classes ImageNet-21K-P leaves out, never packed; {IN21K_P['train']}/ and "
            f"{IN21K_P['val']}/ are missing beside it: extract them there"
        )
    if (root / "val").is_dir():
        return "imagenet", _alone(root, "val", {"val": root / "val"})
    names = _subdirs(root)
    layout_folder = next((name for name in names if name in NEVER_CLASSES), None)
    if layout_folder is not None:
        raise DatasetError(f"{root / layout_folder}: not a class folder: {NEVER_CLASSES[layout_folder]}")
    if names:
        return "class-folders", {"train": root}
    raise DatasetError(f"{root}: no class folders found; accepted layouts: {ACCEPTED_LAYOUTS}")


def _in21k_p(root: Path) -> dict[str, Path]:
    found = {split: root / name for split, name in IN21K_P.items() if (root / name).is_dir()}
    if (root / IN21K_P_SMALL).is_dir():
        logger.info("%s: not read (the classes ImageNet-21K-P leaves out)", root / IN21K_P_SMALL)
    return _with_class_folders(found, IN21K_P["train"])


def _alone(root: Path, val: str, found: dict[str, Path]) -> dict[str, Path]:
    """``found``, a val split without its train split, once no folder beside it could be a class of a train split."""
    beside = [name for name in _subdirs(root) if name != val and name not in (*IN21K_P.values(), IN21K_P_SMALL, "test")]
    if beside:
        raise DatasetError(
            f"{root}: {val}/ beside {beside[0]}/ but no train folder; to pack class folders, move them into a train/ folder "
            f"beside {val}/, or move {val}/ out of SRC"
        )
    return found


def _with_class_folders(found: dict[str, Path], train_name: str) -> dict[str, Path]:
    """``found``, once its train folder (named ``train_name``) holds class folders; a val folder may be flat."""
    train = found.get("train")
    if train is not None and not _subdirs(train):
        raise DatasetError(f"{train}: no class folders inside; expected {train_name}/<wnid>/<image> (accepted: {ACCEPTED_LAYOUTS})")
    return found


def _subdirs(folder: Path) -> list[str]:
    """Names of the visible sub-folders of ``folder``, sorted as ImageFolder sorts classes."""
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if not e.name.startswith(".") and is_folder(e))
    for name in names:
        if _unlistable_reason(name):
            shown = shown_path(str(folder / name))
            raise DatasetError(f"{shown!r}: {_unlistable_reason(name)}" if "\n" in name else f"{shown}: {_unlistable_reason(name)}")
    return names


def _classes(root: Path, split_dirs: dict[str, Path]) -> list[str]:
    """Class names in label order: the train folders, else the val folders, else the val CSV's wnids."""
    if "train" in split_dirs:
        return _class_folders(split_dirs["train"])
    val = split_dirs["val"]
    names = _class_folders(val)
    if names:
        return names
    return sorted({wnid for wnid, _ in read_val_csv(_find_val_csv(root, val)).values()})


def _class_folders(split: Path) -> list[str]:
    """The sub-folders of a split folder, its classes; one named as a layout's split or download folder is a DatasetError,
    never a class (``train/train/<wnid>/`` would pack every image under one label, "train")."""
    names = _subdirs(split)
    nested = next((name for name in names if name in SPLIT_FOLDERS), None)
    if nested is not None:
        raise DatasetError(
            f"{split / nested}: not a class folder: a download's {nested}/ folder inside {split.name}/ (extracted one level too "
            f"deep?); give {split} as SRC, or move what {nested}/ holds up one level"
        )
    return names


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _identity(path: str | os.PathLike) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _walk_images(folder: Path, prefix: str, seen: set[tuple[int, int]], inside: str) -> tuple[list[str], int]:
    """Image paths under ``folder`` (recursively, sorted), each as ``prefix/relative``; and the count of other files.

    Each folder is walked once: ``seen`` holds the (st_dev, st_ino) of every folder walked so
    far in this split (and of the split's class folders), and a symlinked folder whose target
    lies inside ``inside`` (the split folder's real path) is not followed, since the walk
    reaches it by its real path. So neither a loop (``ln -s .. class/up``) nor a second way
    into the tree packs an image twice. A link that cannot be resolved (a dangling link, a
    link loop) is listed like a file and skipped with its reason at pack time.
    """
    found: list[str] = []
    ignored = 0
    stack = [(folder, prefix)]
    while stack:
        current, rel = stack.pop()
        subfolders = []
        with os.scandir(current) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    is_dir = entry.is_dir()
                    if is_dir and entry.is_symlink():
                        real = os.path.realpath(entry.path)
                        if real == inside or real.startswith(inside + os.sep):
                            logger.info("%s: not followed, it links into the tree being scanned", entry.path)
                            continue
                    identity = _identity(entry.path) if is_dir else None
                except OSError:  # e.g. ELOOP: a file link to itself
                    is_dir, identity = False, None
                if is_dir:
                    if identity in seen:
                        continue
                    seen.add(identity)
                    subfolders.append((Path(entry.path), f"{rel}/{entry.name}"))
                elif is_image_name(entry.name):
                    found.append(f"{rel}/{entry.name}")
                else:
                    ignored += 1
        stack.extend(sorted(subfolders, reverse=True))  # a fixed walk order: which way into a folder wins never varies
    found.sort(key=lambda path: path.rpartition("/")[::2])  # by folder, then name: ImageFolder's order
    return found, ignored


def _unlistable_reason(path: str) -> str | None:
    """Why ``path`` cannot be recorded in the sidecar and the manifest, or None."""
    if "\n" in path:
        return NEWLINE_REASON
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return NOT_UTF8_REASON
    return None


def shown_path(path: str) -> str:
    """``path`` as valid UTF-8 text: bytes of a non-UTF-8 name (surrogate escapes) become ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def match_archive_name(pattern: re.Pattern[str], path: Path) -> re.Match[str] | None:
    """``pattern`` matched against the whole file name of ``path`` (``$`` would also match before a final
    newline). A name that matches but for its newlines is a DatasetError, not an archive passed over."""
    match = pattern.fullmatch(path.name)
    if match is None and "\n" in path.name and pattern.fullmatch(path.name.replace("\n", "")):
        raise DatasetError(f"{shown_path(str(path))!r}: {NEWLINE_REASON}")
    return match


def refuse_newlines(tree: SourceTree) -> SourceTree:
    """``tree``, once no item's source path holds a newline: an archive's name (a shard, a class tar, a file
    named one by one) starts the path of every item in it, and the sources sidecar is one path per line."""
    for split, items in tree.splits.items():
        if "\n" in "".join(items.paths):
            path = next(path for path in items.paths if "\n" in path)
            raise DatasetError(f"{shown_path(str(tree.root))}: {split} item {shown_path(path)!r}: a name in it holds a newline "
                               "(the sources sidecar is one path per line); rename it")  # fmt: skip
    return tree


def warn_left_out(where: object, name: str, reason: str) -> None:
    """The warning for a file a scan leaves out (and lists as skipped): one line naming where it is (a folder, an
    archive), the file or member there, and why. Every layout's scan gives it."""
    logger.warning("%s: %r left out: %s", shown_path(str(where)), shown_path(name), reason)


def _reject_unlistable(paths: list[str], folder: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Split off paths with a newline (the sources sidecar holds one path per line) or bytes that are not UTF-8."""
    reasons = [_unlistable_reason(path) for path in paths]
    rejected = [(shown_path(path), reason) for path, reason in zip(paths, reasons) if reason]
    if not rejected:
        return paths, []
    for path, reason in rejected:
        warn_left_out(folder, path, reason)
    return [path for path, reason in zip(paths, reasons) if not reason], rejected


def _scan_class_folders(root: Path, folder: Path, index: dict[str, int], split: str) -> SplitItems:
    base = folder.relative_to(root).as_posix()
    prefix = "" if base == "." else base + "/"
    paths: list[str] = []
    labels: list[np.ndarray] = []
    rejected: list[tuple[str, str]] = []
    ignored = 0
    names = _class_folders(folder)
    inside = os.path.realpath(folder)
    classes: dict[tuple[int, int], str] = {}
    for name in names:
        other = classes.setdefault(_identity(folder / name), name)
        if other != name:
            raise DatasetError(
                f"{folder / name}: the same folder as class {other!r} (a link?), so its images would be packed twice "
                "under two labels; remove one of them"
            )
    seen = {_identity(folder), *classes}
    for name in names:
        if name not in index:
            raise DatasetError(f"{folder / name}: {split} class {name!r} is not a train class; remove it or add it to train/")
        files, skipped = _walk_images(folder / name, f"{prefix}{name}", seen, inside)
        ignored += skipped
        files, bad = _reject_unlistable(files, folder / name)
        rejected += bad
        if not files:
            logger.warning("%s: class folder has no images; its label %d stays reserved", folder / name, index[name])
        paths.extend(files)
        labels.append(np.full(len(files), index[name], dtype=np.int32))
    if ignored:
        logger.info("%s: ignored %d files without an image extension", folder, ignored)
    return SplitItems(paths, np.concatenate(labels) if labels else np.zeros(0, np.int32), rejected)


def _find_val_csv(root: Path, val: Path) -> Path:
    folders = [val.parent, root, val]
    if val.parent.parts[-3:] == KAGGLE_DATA:  # inside a Kaggle download: its CSV lies beside ILSVRC/
        folders.append(val.parent.parents[2])
    for candidate in (folder / VAL_CSV for folder in folders):
        if is_source_file(candidate):
            return candidate
    instead = ", or pack only train (--splits train)" if (val.parent / "train").is_dir() else ""
    raise DatasetError(
        f"{val}: flat val folder but no {VAL_CSV} beside it or at {root}; put the Kaggle {VAL_CSV} there or sort val into class "
        f"folders{instead}"
    )


def read_val_csv(path: Path, data: bytes | None = None) -> dict[str, tuple[str, int]]:
    """ImageId -> (wnid, line number) from a Kaggle ``LOC_val_solution.csv`` (its ``data`` when given, e.g. read from a zip)."""
    if data is None:
        data = path.read_bytes()  # an OSError names the file (pack turns it into one line)
    rows: dict[str, tuple[str, int]] = {}
    reader = csv.reader(io.StringIO(_csv_text(path, data), newline=""))
    try:
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["ImageId", "PredictionString"]:
            raise DatasetError(f"{path}: line 1 must be the header 'ImageId,PredictionString', got {header!r}")
        for row in reader:
            if not row or not any(cell.strip() for cell in row):
                continue
            words = row[1].split() if len(row) >= 2 else []
            if not row[0].strip() or not words:
                raise DatasetError(f"{path}: line {reader.line_num}: expected 'ImageId,<wnid> x y x y ...', got {','.join(row)!r}")
            image_id = row[0].strip()
            earlier = rows.setdefault(image_id, (words[0], reader.line_num))
            if earlier[0] != words[0]:
                raise DatasetError(
                    f"{path}: line {reader.line_num}: {image_id} is {words[0]}, but line {earlier[1]} says {earlier[0]}; keep one row"
                )
    except csv.Error as e:
        raise DatasetError(f"{path}: line {reader.line_num}: not readable as CSV ({e})") from None
    return rows


def _csv_text(path: Path, data: bytes) -> str:
    """UTF-8, with or without a byte-order mark (Excel's "CSV UTF-8"), or UTF-16 with its BOM; else a DatasetError."""
    encoding = "utf-16" if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        what = "UTF-16" if encoding == "utf-16" else "UTF-8"
        raise DatasetError(f"{path}: not {what} text (byte {data[e.start]:#04x} at offset {e.start}); save it as CSV UTF-8") from None


def _scan_flat_val(root: Path, folder: Path, index: dict[str, int]) -> SplitItems:
    base = folder.relative_to(root).as_posix()
    names, ignored = _walk_images(folder, base, {_identity(folder)}, os.path.realpath(folder))
    names, rejected = _reject_unlistable(names, folder)
    if not names:  # an empty val/ needs no label file; the packer leaves the split out
        return SplitItems([], np.zeros(0, np.int32), rejected)
    if ignored:
        logger.info("%s: ignored %d files without an image extension", folder, ignored)
    return SplitItems(names, label_flat_val(root, names, _find_val_csv(root, folder), index), rejected)


def label_flat_val(root: Path, names: list[str], csv_path: Path, index: dict[str, int], csv_data: bytes | None = None) -> np.ndarray:
    """The label of each flat val image (``.../<ImageId>.<ext>``, relative to ``root``) from a LOC_val_solution.csv
    (``csv_data``: its bytes, when it is not a file of its own)."""
    rows = read_val_csv(csv_path, csv_data)
    labels = np.empty(len(names), dtype=np.int32)
    for i, path in enumerate(names):
        image_id = os.path.splitext(path.rsplit("/", 1)[-1])[0]
        row = rows.get(image_id)
        if row is None:
            raise DatasetError(f"{root / path}: no row for {image_id!r} in {csv_path}; add its label there or remove the file")
        wnid, line = row
        if wnid not in index:
            raise DatasetError(f"{csv_path}: line {line}: class {wnid!r} of {image_id} is not one of the {len(index)} train classes")
        labels[i] = index[wnid]
    if len(rows) > len(names):
        logger.warning("%s lists %d images; %d of them are in %s", csv_path, len(rows), len(names), root)
    return labels
