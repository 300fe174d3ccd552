"""ImageNet-21k as image-net.org releases it: a folder of one tar per synset, read in place.

The winter21 and fall11 releases are ``<wnid>.tar`` files, one per synset, each holding that synset's
images flat (what ``tar xf fall11_whole.tar`` or ``tar xzf winter21_whole.tar.gz`` leaves, or the
per-synset downloads). Each class tar is listed in parallel as ``imagenet_tars`` lists those of the
train tar; items are ``<wnid>.tar/<name>`` spans, in the extracted class folders' order and labelled by
sorted wnid, so the shards are byte-identical to a pack of the extracted tree. The outer
``fall11_whole.tar`` is read in place as a train tar by ``imagenet_tars``.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.procs import map_in_processes
from imgpipe.errors import DatasetError
from imgpipe.ingest.filekinds import is_folder, is_source_file
from imgpipe.ingest.folders import SourceTree, SplitItems
from imgpipe.ingest.imagenet_tars import _list_images, _Listing
from imgpipe.ingest.members import ArchiveFile, MemberSpans

logger = logging.getLogger(__name__)

LAYOUT = "synset-tars"
SYNSET_TAR = re.compile(r"n\d{8}\.tar")  # a WordNet noun id, as every ImageNet synset is named


def find_synset_tars(src: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path] | None:
    """The ``<wnid>.tar`` files of the folder SRC, sorted; None when SRC is not such a folder."""
    if not isinstance(src, (str, os.PathLike)):
        return None
    root = Path(os.path.abspath(src))
    if not root.is_dir():
        return None
    tars, folders = [], []
    with os.scandir(root) as entries:
        for entry in entries:
            if SYNSET_TAR.fullmatch(entry.name) and is_source_file(Path(entry.path)):
                tars.append(Path(entry.path))
            elif not entry.name.startswith(".") and is_folder(entry):
                folders.append(entry.name)
    if not tars:
        return None
    if folders:
        raise DatasetError(
            f"{root}: holds both synset tars ({tars[0].name}) and folders ({sorted(folders)[0]}/), a half-done extraction?; "
            "pack the tars (move the folders away) or the extracted folders (move the tars away)"
        )
    return sorted(tars)


def scan_synset_tars(tars: list[Path], splits: Sequence[str] | None, workers: int | None = None) -> SourceTree:
    """The classes and items of a folder of synset tars: split ``train``, one class per tar, labels by sorted wnid."""
    root = tars[0].parent
    unknown = [s for s in (splits or ()) if s != "train"]
    if unknown:
        raise DatasetError(f"{root}: split {', '.join(map(repr, unknown))} not found (synset tars hold only train)")
    wnids = [path.name[: -len(".tar")] for path in tars]
    tasks = [(ArchiveFile.of(path), 0, path.stat().st_size, path.name, root) for path in tars]
    processes = min(workers or available_cpus(), len(tasks))
    chunks = max(1, len(tasks) // (8 * processes))
    listings: list[_Listing] = list(map_in_processes(_list_task, tasks, workers=processes, chunksize=chunks))
    for label, (wnid, listing) in enumerate(zip(wnids, listings)):
        if not listing.names:
            logger.warning("%s/%s.tar: class tar has no images; its label %d stays reserved", root, wnid, label)
    ignored = sum(listing.ignored for listing in listings)
    if ignored:
        logger.info("%s: ignored %d members without an image extension", root, ignored)
    spans = MemberSpans.concat([MemberSpans.of(task[0], listing.offsets, listing.sizes) for task, listing in zip(tasks, listings)])
    items = SplitItems(
        [name for listing in listings for name in listing.names],
        np.concatenate([np.full(len(listing.names), label, np.int32) for label, listing in enumerate(listings)]),
        [rejected for listing in listings for rejected in listing.rejected],
        spans,
    )
    logger.info("train: %d images in %d synset tars in %s", len(items), len(tars), root)
    return SourceTree(root=root, layout=LAYOUT, classes=wnids, splits={"train": items})


def _list_task(task: tuple[ArchiveFile, int, int, str, Path]) -> _Listing:
    return _list_images(*task)
