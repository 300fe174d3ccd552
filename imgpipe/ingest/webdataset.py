"""Scan WebDataset shards in place, as timm publishes ImageNet (``timm/imagenet-1k-wds``).

Members are grouped into samples as webdataset's ``tariterators`` groups them, and a sample is read as
timm's ``reader_wds`` reads it (image, label, file name; docs/cli.md). Items are those of the tree the
samples make (``train/<class>/<file name>`` and a flat ``val/``), in that tree's order, each a span of
its shard read with one ``pread``; a sample with a label but no image, or an image but no label, is a
DatasetError naming the shard and the member.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.procs import map_in_processes
from imgpipe.errors import DatasetError
from imgpipe.format.manifest import stays_inside_source_root
from imgpipe.ingest.classnames import names_for_indices
from imgpipe.ingest.filekinds import is_source_file, tar_reason
from imgpipe.ingest.folders import NEWLINE_REASON, SourceTree, SplitItems, match_archive_name, warn_left_out
from imgpipe.ingest.imagenet_tars import ESCAPE_REASON, list_tar
from imgpipe.ingest.members import ArchiveFile, MemberSpans, OpenArchive

logger = logging.getLogger(__name__)

LAYOUT = "wds"
SHARD_NAME = re.compile(r"(?P<name>.+)-(?P<split>train|validation|val)-(?P<number>\d+)\.tar")  # the whole file name
SPLITS = {"train": "train", "validation": "val", "val": "val"}
INFO_NAMES = ("_info.json", "info.json")  # timm's _load_info tries these, in this order
IMAGE_SUFFIXES = ("jpg", "png", "webp")  # timm's reader_wds input_key 'jpg;png;webp', first found wins
KEY_EXT = ".JPEG"  # reader_wds' key_ext: the file name of a sample without a .json filename is its key + this
KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset's tar_file_iterator skip_meta (matched at the start)
TRAIN_FILE = re.compile(r"(?P<wnid>n[0-9]{8})_[0-9]+\.JPEG")  # an ImageNet train image's file name: n01440764_10026.JPEG
MAX_SIDECAR_BYTES = 1 << 20  # .cls and .json are a few bytes; a larger one is not read whole


@dataclass(frozen=True)
class WdsShards:
    """Split -> its shards in order; from timm's ``_info.json`` when SRC has one: that file, each split's
    ``shard_lengths`` (sample counts, when given) and ``alt_label`` (the ``.json`` field that labels it, when given)."""

    splits: dict[str, list[Path]]
    info: Path | None = None
    lengths: dict[str, list[int]] = field(default_factory=dict)
    alt_labels: dict[str, str] = field(default_factory=dict)


@dataclass
class _Shard:
    """The samples of one shard: label, file name and image span of each, and what was wrong."""

    labels: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (file name, reason)
    samples: int = 0
    ignored: int = 0
    unlabelled: int = 0
    irregular: int = 0  # members that are not regular files: skipped, as webdataset skips them
    without_image: set[str] = field(default_factory=set)  # keys whose image member is not a regular file (listed in rejected)


def find_shards(src: str | os.PathLike | Sequence[str | os.PathLike]) -> WdsShards | None:
    """The shards SRC names: a folder of them (described by its ``_info.json``, or by their names), or shards named one by one."""
    if isinstance(src, (str, os.PathLike)):
        path = Path(os.path.abspath(src))
        if path.is_dir() and ((path / "train").is_dir() or (path / "ILSVRC").is_dir()):
            return None
        info = next((path / name for name in INFO_NAMES if (path / name).is_file()), None) if path.is_dir() else None
        described = _from_info(path, info) if info is not None else None
        if described is not None:
            return described
        paths = sorted(path.iterdir()) if path.is_dir() else [path]
    else:
        paths = [Path(os.path.abspath(p)) for p in src]
    shards: dict[str, list[Path]] = {}
    for path in paths:
        match = match_archive_name(SHARD_NAME, path)
        if match and is_source_file(path):
            shards.setdefault(SPLITS[match["split"]], []).append(path)
        elif not isinstance(src, (str, os.PathLike)):
            return None
    for split in shards:
        shards[split].sort(key=lambda p: (SHARD_NAME.fullmatch(p.name)["name"], int(SHARD_NAME.fullmatch(p.name)["number"])))  # type: ignore[index]
    ordered = dict(sorted(shards.items(), key=lambda item: item[0] != "train"))
    return WdsShards(ordered) if ordered else None


def _from_info(root: Path, info: Path) -> WdsShards | None:
    """The splits timm's ``_info.json`` lists (``splits.<name>.filenames``, relative to ``root``), or None when it lists no
    train or validation shards; a shard it lists that is not there is a DatasetError."""
    try:
        described = json.loads(info.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise DatasetError(f"{info}: not readable as timm's dataset info ({e}); fix it or move it away") from None
    entries = described.get("splits") if isinstance(described, dict) else None
    found = WdsShards({}, info)
    for name, split in SPLITS.items():
        entry = entries.get(name) if isinstance(entries, dict) else None
        filenames = entry.get("filenames") if isinstance(entry, dict) else None
        if split in found.splits or not isinstance(filenames, list) or not filenames:
            continue
        if not all(isinstance(f, str) and f.endswith(".tar") for f in filenames):
            return None  # not a WebDataset's info
        outside = next((f for f in filenames if not stays_inside_source_root(f)), None)
        if outside is not None:
            raise DatasetError(
                f"{info}: split {name!r} lists {outside!r}, outside {root}; list the shards by their paths inside that folder"
            )
        paths = [root / f for f in filenames]
        absent = next((p for p in paths if not is_source_file(p)), None)
        if absent is not None:
            raise DatasetError(
                f"{info}: split {name!r} lists {absent.name}, which is not in {absent.parent}; download it (timm reads every shard listed)"
            )
        found.splits[split] = paths
        lengths = entry.get("shard_lengths")
        if isinstance(lengths, list) and len(lengths) == len(paths) and all(isinstance(n, int) for n in lengths):
            found.lengths[split] = lengths
        if isinstance(entry.get("alt_label"), str) and entry["alt_label"]:
            found.alt_labels[split] = entry["alt_label"]
    return found if found.splits else None


def scan_shards(shards: WdsShards, splits: Sequence[str] | None, workers: int | None = None) -> SourceTree:
    """The classes and items of WebDataset shards, like ``folders.scan_folders`` gives for the tree their samples make."""
    wanted = list(shards.splits) if splits is None else list(dict.fromkeys(splits))
    missing = [s for s in wanted if s not in shards.splits]
    root = (
        shards.info.parent if shards.info is not None else Path(os.path.commonpath([p.parent for ps in shards.splits.values() for p in ps]))
    )
    if missing:
        raise DatasetError(f"{root}: split {', '.join(map(repr, missing))} not found (these shards hold: {', '.join(shards.splits)})")
    tasks = [(split, path, shards.alt_labels.get(split, "")) for split in wanted for path in shards.splits[split]]
    processes = min(workers or available_cpus(), len(tasks))
    listed = list(map_in_processes(_list_shard_task, tasks, workers=processes, chunksize=max(1, len(tasks) // (8 * processes))))
    per_split = {split: [(ArchiveFile.of(path), shard) for (s, path, _), shard in zip(tasks, listed) if s == split] for split in wanted}
    for split, lengths in shards.lengths.items():
        for (shard_file, shard), expected in zip(per_split.get(split, []), lengths):
            if shard.samples != expected:
                logger.warning(
                    "%s: %d samples, but %s says %d; download it again if it is damaged", shard_file, shard.samples, shards.info, expected
                )
    label_source = "train" if "train" in per_split else wanted[0]
    names = _class_names(per_split[label_source])
    classes = sorted(names.values())
    index = {name: k for k, name in enumerate(classes)}
    tree = SourceTree(root=root, layout=LAYOUT, classes=classes)
    for split, listed_shards in per_split.items():
        tree.splits[split] = _items(split, listed_shards, names, index, shards.alt_labels.get(split, ""))
        logger.info("%s: %d images in %d shard(s)", split, len(tree.splits[split]), len(listed_shards))
    return tree


def _class_names(listed: list[tuple[ArchiveFile, _Shard]]) -> dict[int, str]:
    """Label -> class name: the wnid that every sample of the label names in its file name (``n01440764_149.JPEG``),
    where every sample names one and the wnids follow the labels one to one and in order (so the packed labels are
    the same either way); else ``names_for_indices``."""
    labels = [label for _, shard in listed for label in shard.labels]
    wnids: dict[int, str] = {}
    for _, shard in listed:
        for label, name in zip(shard.labels, shard.names):
            match = TRAIN_FILE.fullmatch(name.rpartition("/")[2])
            if match is None or wnids.setdefault(label, match["wnid"]) != match["wnid"]:
                return names_for_indices(labels)
    in_label_order = [wnids[label] for label in sorted(wnids)]
    if in_label_order != sorted(set(in_label_order)):
        logger.info("classes named by label: the wnids the file names give are not one per label in the labels' order")
        return names_for_indices(labels)
    return wnids


def _items(
    split: str, listed: list[tuple[ArchiveFile, _Shard]], names: dict[int, str], index: dict[str, int], alt_label: str
) -> SplitItems:
    """The split's items in the tree's order: train by class, then file name; val by file name."""
    paths, labels, archive, offsets, sizes, rejected = [], [], [], [], [], []
    seen: dict[tuple[int, str], str] = {}
    for k, (shard_file, shard) in enumerate(listed):
        for label, name, offset, size in zip(shard.labels, shard.names, shard.offsets, shard.sizes):
            if label not in names:
                raise DatasetError(f"{shard_file}: a {split} sample of {name} has label {label}, which no train sample has")
            label = index[names[label]]
            where = (label if split == "train" else -1, name)
            if where in seen:
                raise DatasetError(
                    f"{shard_file}: {name} is a {split} sample of {seen[where]} too; the tree of these samples has one file by that name"
                )
            seen[where] = shard_file.name
            paths.append(f"{shard_file.name}/{name}")
            labels.append(label)
            archive.append(k)
            offsets.append(offset)
            sizes.append(size)
        for name, reason in shard.rejected:
            warn_left_out(shard_file, name, reason)
            rejected.append((f"{shard_file.name}/{name}", reason))
        if shard.ignored:
            logger.info("%s: ignored %d samples without an image or label", shard_file, shard.ignored)
        if shard.unlabelled:
            logger.info("%s: left out %d samples whose %r is -1, as timm does", shard_file, shard.unlabelled, alt_label)
        if shard.irregular:
            logger.warning("%s: ignored %d members that are not regular files (links, devices), as webdataset does", shard_file,
                           shard.irregular)  # fmt: skip
    file_names = [path.split("/", 1)[1] for path in paths]
    keys = [name.rpartition("/")[::2] for name in file_names]
    order = sorted(range(len(paths)), key=lambda k: (labels[k], keys[k]) if split == "train" else keys[k])
    spans = MemberSpans(
        tuple(shard_file for shard_file, _ in listed), np.array(archive, np.int32)[order], np.array(offsets, np.int64)[order],
        np.array(sizes, np.int64)[order],
    )  # fmt: skip
    return SplitItems([paths[k] for k in order], np.array(labels, np.int32)[order], rejected, spans)


def _list_shard_task(task: tuple[str, Path, str]) -> _Shard:
    return list_shard(task[1], task[2])


def list_shard(path: Path, alt_label: str = "") -> _Shard:
    """The samples of one shard, grouped as webdataset groups them; labelled by ``.cls``, or by the ``.json``'s ``alt_label``."""
    archive = ArchiveFile.of(path)
    shard = _Shard()
    with OpenArchive(archive) as source:
        members = list_tar(source, 0, source.size, str(path), path.name)
        sample: dict[str, tuple[str, int, int]] = {}
        key = None
        for member in members:
            if member.type == tarfile.DIRTYPE:
                continue
            reason = tar_reason(member)
            if reason is not None:
                _skip_irregular(member.name, reason, shard)
                continue
            name = member.name
            if ("/" not in name and name.startswith("__") and name.endswith("__")) or SKIP_META.match(name):
                continue  # webdataset's metadata members
            match = KEY.match(name)
            if match is None:
                continue
            if match[1] != key:
                _add_sample(source, path, key, sample, shard, alt_label)
                key, sample = match[1], {}
            suffix = match[2].lower()
            if suffix in sample:
                raise DatasetError(f"{path}: member {name}: sample {key!r} has two .{suffix} members (webdataset refuses it too)")
            sample[suffix] = (name, member.offset, member.size)
        _add_sample(source, path, key, sample, shard, alt_label)
    return shard


def _skip_irregular(name: str, reason: str, shard: _Shard) -> None:
    """A member that is not a regular file is skipped, as webdataset skips it; one that would be its sample's image is listed."""
    match = KEY.match(name)
    if match is not None and match[2].lower() in IMAGE_SUFFIXES:
        shard.rejected.append((name, reason))
        shard.without_image.add(match[1])
    else:
        shard.irregular += 1


def _add_sample(
    source: OpenArchive, path: Path, key: str | None, sample: dict[str, tuple[str, int, int]], shard: _Shard, alt_label: str
) -> None:
    if key is None or not sample:
        return
    shard.samples += 1
    image = next((sample[s] for s in IMAGE_SUFFIXES if s in sample), None)
    label_suffix = "json" if alt_label else "cls"
    if label_suffix not in sample:
        if image is not None:
            raise DatasetError(
                f"{path}: member {image[0]}: sample {key!r} has an image but no .{label_suffix} label; add one or remove the sample"
            )
        shard.ignored += 1
        return
    if image is None and key in shard.without_image:
        return  # listed as skipped
    if image is None:
        raise DatasetError(
            f"{path}: member {sample[label_suffix][0]}: sample {key!r} has a .{label_suffix} label but no .jpg, .png or .webp image"
        )
    meta = _json(source, path, sample["json"]) if "json" in sample else None
    label = _alt_label(path, sample["json"][0], meta, alt_label) if alt_label else _cls_label(source, path, sample["cls"])
    if label < 0:
        shard.unlabelled += 1
        return
    name = meta["filename"] if isinstance(meta, dict) and isinstance(meta.get("filename"), str) and meta["filename"] else key + KEY_EXT
    if not stays_inside_source_root(name) or "\n" in name:
        shard.rejected.append((name, ESCAPE_REASON if "\n" not in name else NEWLINE_REASON))
        return
    shard.labels.append(label)
    shard.names.append(name)
    shard.offsets.append(image[1])
    shard.sizes.append(image[2])


def _cls_label(source: OpenArchive, path: Path, member: tuple[str, int, int]) -> int:
    text = _sidecar(source, path, member)
    try:
        label = int(text)
    except ValueError:
        label = -1
    if label < 0:
        raise DatasetError(f"{path}: member {member[0]}: .cls holds {text[:40]!r}, not a class index")
    return label


def _alt_label(path: Path, member: str, meta: object, alt_label: str) -> int:
    """The ``.json``'s ``alt_label`` field as timm's ``_decode`` reads it (an integer; -1: no label)."""
    try:
        return int(meta[alt_label])  # type: ignore[index]
    except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: Infinity, which json reads
        raise DatasetError(f"{path}: member {member}: no integer {alt_label!r}, the split's label in timm's _info.json") from None


def _json(source: OpenArchive, path: Path, member: tuple[str, int, int]) -> object:
    try:
        return json.loads(_sidecar(source, path, member))
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return None


def _sidecar(source: OpenArchive, path: Path, member: tuple[str, int, int]) -> str:
    name, offset, size = member
    if size > MAX_SIDECAR_BYTES:
        raise DatasetError(f"{path}: member {name} is {size:,} bytes; a .cls or .json sidecar holds a few")
    return source.pread(size, offset).decode("utf-8", "replace").strip()
