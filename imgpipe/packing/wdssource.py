"""Scan WebDataset shards in place, as timm publishes ImageNet (``timm/imagenet-1k-wds``).

Shards are ``<name>-train-<n>.tar`` and ``<name>-validation-<n>.tar`` (``-val-`` too). Members
are grouped as webdataset groups them (``tariterators.group_by_keys``): regular members only,
the key is the member name up to the first dot of its base name, the rest (lower-cased) its
suffix, consecutive members with one key make a sample, and a suffix twice in one sample is
an error. As timm's ``reader_wds`` reads a sample: the image is the first of ``jpg``, ``png``,
``webp``, the label the integer text of ``.cls``; the file name is the ``.json``'s
``filename`` where it has one, else the image member's name. Classes are named by
``classnames.names_for_indices`` (ILSVRC2012's wnids for exactly its 1,000 indices).

Items are those of the tree the samples make (``train/<class>/<file name>`` and a flat
``val/``), in that tree's order, each a span of its shard read with one ``pread``; source
paths are ``<shard>/<file name>``. A sample with a label but no image, or an image but no
label, is a DatasetError naming the shard and the member.
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

from imgpipe._sys.distenv import available_cpus
from imgpipe._sys.procs import map_in_processes
from imgpipe.errors import DatasetError
from imgpipe.format.manifest import stays_inside_source_root
from imgpipe.packing.classnames import names_for_indices
from imgpipe.packing.members import ArchiveFile, MemberSpans, OpenArchive
from imgpipe.packing.source import NEWLINE_REASON, SourceTree, SplitItems
from imgpipe.packing.tarsource import ESCAPE_REASON, list_tar

logger = logging.getLogger(__name__)

LAYOUT = "wds"
SHARD_NAME = re.compile(r"^(?P<name>.+)-(?P<split>train|validation|val)-(?P<number>\d+)\.tar$")
SPLITS = {"train": "train", "validation": "val", "val": "val"}
IMAGE_SUFFIXES = ("jpg", "png", "webp")  # timm's reader_wds input_key 'jpg;png;webp', first found wins
KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
MAX_SIDECAR_BYTES = 1 << 20  # .cls and .json are a few bytes; a larger one is not read whole


@dataclass
class _Shard:
    """The samples of one shard: label, file name and image span of each, and what was wrong."""

    labels: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    ignored: int = 0
    links: int = 0


def find_shards(src: str | os.PathLike | Sequence[str | os.PathLike]) -> dict[str, list[Path]] | None:
    """Split -> its shards in number order, when SRC is WebDataset shards (a folder of them, or shards named one by one)."""
    if isinstance(src, (str, os.PathLike)):
        path = Path(os.path.abspath(src))
        paths = sorted(path.iterdir()) if path.is_dir() else [path]
        if path.is_dir() and ((path / "train").is_dir() or (path / "ILSVRC").is_dir()):
            return None
    else:
        paths = [Path(os.path.abspath(p)) for p in src]
    shards: dict[str, list[Path]] = {}
    for path in paths:
        match = SHARD_NAME.match(path.name)
        if match and path.is_file():
            shards.setdefault(SPLITS[match["split"]], []).append(path)
        elif not isinstance(src, (str, os.PathLike)):
            return None
    for split in shards:
        shards[split].sort(key=lambda p: (SHARD_NAME.match(p.name)["name"], int(SHARD_NAME.match(p.name)["number"])))  # type: ignore[index]
    return dict(sorted(shards.items(), key=lambda item: item[0] != "train")) or None


def scan_shards(shards: dict[str, list[Path]], splits: Sequence[str] | None, workers: int | None = None) -> SourceTree:
    """The classes and items of WebDataset shards, like ``source.scan`` gives for the tree their samples make."""
    wanted = list(shards) if splits is None else list(dict.fromkeys(splits))
    missing = [s for s in wanted if s not in shards]
    root = Path(os.path.commonpath([p.parent for paths in shards.values() for p in paths]))
    if missing:
        raise DatasetError(f"{root}: split {', '.join(map(repr, missing))} not found (these shards hold: {', '.join(shards)})")
    tasks = [(split, path) for split in wanted for path in shards[split]]
    processes = min(workers or available_cpus(), len(tasks))
    listed = list(map_in_processes(_list_shard_task, tasks, workers=processes, chunksize=max(1, len(tasks) // (8 * processes))))
    per_split = {split: [(ArchiveFile.of(path), shard) for (s, path), shard in zip(tasks, listed) if s == split] for split in wanted}
    label_source = "train" if "train" in per_split else wanted[0]
    names = names_for_indices(label for _, shard in per_split[label_source] for label in shard.labels)
    classes = sorted(names.values())
    index = {name: k for k, name in enumerate(classes)}
    tree = SourceTree(root=root, layout=LAYOUT, classes=classes)
    for split, listed_shards in per_split.items():
        tree.splits[split] = _items(split, listed_shards, names, index, root)
        logger.info("%s: %d images in %d shard(s)", split, len(tree.splits[split]), len(listed_shards))
    return tree


def _items(split: str, listed: list[tuple[ArchiveFile, _Shard]], names: dict[int, str], index: dict[str, int], root: Path) -> SplitItems:
    """The split's items in the tree's order: train by class, then file name; val by file name."""
    paths, labels, archive, offsets, sizes, rejected = [], [], [], [], [], []
    seen: dict[tuple[int, str], str] = {}
    for k, (shard_file, shard) in enumerate(listed):
        for label, name, offset, size in zip(shard.labels, shard.names, shard.offsets, shard.sizes):
            if label not in names:
                raise DatasetError(f"{shard_file}: a {split} sample of {name} has .cls {label}, which no train sample has")
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
        rejected += shard.rejected
        if shard.ignored:
            logger.info("%s: ignored %d samples without an image or label", shard_file, shard.ignored)
        if shard.links:
            logger.warning("%s: ignored %d link members, as webdataset does", shard_file, shard.links)
    file_names = [path.split("/", 1)[1] for path in paths]
    keys = [name.rpartition("/")[::2] for name in file_names]
    order = sorted(range(len(paths)), key=lambda k: (labels[k], keys[k]) if split == "train" else keys[k])
    spans = MemberSpans(
        tuple(shard_file for shard_file, _ in listed), np.array(archive, np.int32)[order], np.array(offsets, np.int64)[order],
        np.array(sizes, np.int64)[order],
    )  # fmt: skip
    return SplitItems([paths[k] for k in order], np.array(labels, np.int32)[order], rejected, spans)


def _list_shard_task(task: tuple[str, Path]) -> _Shard:
    return list_shard(task[1])


def list_shard(path: Path) -> _Shard:
    """The samples of one shard, grouped as webdataset groups them."""
    archive = ArchiveFile.of(path)
    shard = _Shard()
    with OpenArchive(archive) as source:
        members = list_tar(source, 0, source.size, str(path), path.name)
        sample: dict[str, tuple[str, int, int]] = {}
        key = None
        for member in members:
            if member.type not in tarfile.REGULAR_TYPES:
                shard.links += member.type in (tarfile.LNKTYPE, tarfile.SYMTYPE)
                continue
            base = member.name.rsplit("/", 1)[-1]
            if "/" not in member.name and base.startswith("__") and base.endswith("__"):
                continue  # webdataset's metadata members
            match = KEY.match(member.name)
            if match is None:
                continue
            if match[1] != key:
                _add_sample(source, path, key, sample, shard)
                key, sample = match[1], {}
            suffix = match[2].lower()
            if suffix in sample:
                raise DatasetError(f"{path}: member {member.name}: sample {key!r} has two .{suffix} members (webdataset refuses it too)")
            sample[suffix] = (member.name, member.offset, member.size)
        _add_sample(source, path, key, sample, shard)
    return shard


def _add_sample(source: OpenArchive, path: Path, key: str | None, sample: dict[str, tuple[str, int, int]], shard: _Shard) -> None:
    if key is None or not sample:
        return
    image = next((sample[s] for s in IMAGE_SUFFIXES if s in sample), None)
    if "cls" not in sample:
        if image is not None:
            raise DatasetError(f"{path}: member {image[0]}: sample {key!r} has an image but no .cls label; add one or remove the sample")
        shard.ignored += 1
        return
    if image is None:
        raise DatasetError(f"{path}: member {sample['cls'][0]}: sample {key!r} has a .cls label but no .jpg, .png or .webp image")
    text = _sidecar(source, path, sample["cls"])
    try:
        label = int(text)
    except ValueError:
        label = -1
    if label < 0:
        raise DatasetError(f"{path}: member {sample['cls'][0]}: .cls holds {text[:40]!r}, not a class index")
    name = image[0].rsplit("/", 1)[-1]
    if "json" in sample:
        try:
            meta = json.loads(_sidecar(source, path, sample["json"]))
        except ValueError:
            meta = None
        if isinstance(meta, dict) and isinstance(meta.get("filename"), str) and meta["filename"]:
            name = meta["filename"]
    if not stays_inside_source_root(name) or "\n" in name:
        shard.rejected.append((f"{path.name}/{name}", ESCAPE_REASON if "\n" not in name else NEWLINE_REASON))
        return
    shard.labels.append(label)
    shard.names.append(name)
    shard.offsets.append(image[1])
    shard.sizes.append(image[2])


def _sidecar(source: OpenArchive, path: Path, member: tuple[str, int, int]) -> str:
    name, offset, size = member
    if size > MAX_SIDECAR_BYTES:
        raise DatasetError(f"{path}: member {name} is {size:,} bytes; a .cls or .json sidecar holds a few")
    return source.pread(size, offset).decode("utf-8", "replace").strip()
