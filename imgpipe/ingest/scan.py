"""Which archive layout SRC is, read in place: the scan of each lives in its own module.

``kaggle-zip`` (``kaggle_zip``), ``hf-parquet`` / ``hf-tar`` (``huggingface``), ``wds`` (``webdataset``),
``tarballs`` / ``split-tar`` (``imagenet_tars``) and ``synset-tars`` (``synset_tars``), tried in that
order; none of them when SRC is a folder tree (``train/``, the extracted Kaggle download, class
folders: ``folders``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from imgpipe.ingest.folders import SourceTree, refuse_newlines, scan_folders

ARCHIVE_LAYOUTS = ("tarballs", "split-tar", "kaggle-zip", "hf-parquet", "hf-tar", "wds", "synset-tars")


def scan_archives(
    src: str | os.PathLike | Sequence[str | os.PathLike], splits: Sequence[str] | None, workers: int | None, cache: Path | None
) -> SourceTree | None:
    """The scanned source when SRC is one of the archive layouts, else None; no item's path holds a newline."""
    tree = _scan_archive_layout(src, splits, workers, cache)
    return None if tree is None else refuse_newlines(tree)


def _scan_archive_layout(
    src: str | os.PathLike | Sequence[str | os.PathLike], splits: Sequence[str] | None, workers: int | None, cache: Path | None
) -> SourceTree | None:
    from imgpipe.ingest import huggingface as hfsource
    from imgpipe.ingest import imagenet_tars as tarsource
    from imgpipe.ingest import kaggle_zip as zipsource
    from imgpipe.ingest import synset_tars
    from imgpipe.ingest import webdataset as wdssource

    zip_path = zipsource.find_zip(src)
    if zip_path is not None:
        return zipsource.scan_zip(zip_path, splits)
    hf = hfsource.find_hf(src)
    if hf is not None:
        return hfsource.scan_hf(hf, splits, workers, cache)
    shards = wdssource.find_shards(src)
    if shards is not None:
        return wdssource.scan_shards(shards, splits, workers)
    tars = tarsource.find_tars(src)
    if tars is not None:
        return tarsource.scan_tars(tars, splits, workers)
    synsets = synset_tars.find_synset_tars(src)
    if synsets is not None:
        return synset_tars.scan_synset_tars(synsets, splits, workers)
    return None


def scan(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    splits: Sequence[str] | None = None,
    workers: int | None = None,
    cache: Path | None = None,
) -> SourceTree:
    """Scan ``src`` for the requested splits (all found when None); a DatasetError says what is wrong.

    ``src`` may also be archives (a folder holding them, one archive, or the files named one by
    one): they are listed in place, with ``workers`` processes, keeping listings that cost a
    full read (``.tar.gz``, Parquet) in ``cache``.
    """
    tree = scan_archives(src, splits, workers, cache)
    if tree is not None:
        return tree
    assert isinstance(src, (str, os.PathLike))
    return scan_folders(src, splits)
