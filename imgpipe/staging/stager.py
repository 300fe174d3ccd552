"""``stage(SRC, DST)``: copy a packed folder whole between two locations, every file checked, manifest last.

SRC and DST are each a local (or mounted) folder or a URL. Every file the manifest names is copied and
its sha256 compared with the manifest's; the manifest is written last, byte for byte SRC's, so a DST
without it is an incomplete copy, which the loaders and ``imgpipe verify`` refuse. Each file verified in
place is journaled (``target``), so a rerun after ``kill -9`` copies only the rest; several stagers of one
local DST, and the trainer's ranks waiting for their node's copy: ``waiting``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from imgpipe._sys.diskinfo import check_free_space, format_bytes
from imgpipe._sys.pidlock import release
from imgpipe.errors import ConfigError, DatasetError
from imgpipe.format.files import SIDECAR_SUFFIXES, is_shard_file
from imgpipe.format.manifest import MANIFEST_NAME, parse_manifest
from imgpipe.format.unfinished import JOURNAL_DIR, unfinished_pack
from imgpipe.staging.copier import Copier
from imgpipe.staging.plan import ListedFile, StagedFile, manifest_files, staged
from imgpipe.staging.target import LocalTarget, StoreTarget, Target
from imgpipe.staging.waiting import STALL_S, lock_or_wait, record_failure, wait_for_copy
from imgpipe.storage.local import LocalSource
from imgpipe.storage.opening import open_source
from imgpipe.storage.source import ByteSource, is_url

logger = logging.getLogger(__name__)

DEFAULT_JOBS = 16  # ranges copied at once, across files


@dataclass
class StageReport:
    """What a stage did: ``copied_bytes`` of ``total_bytes`` moved (the rest was in DST already, verified)."""

    src: str
    dst: str
    files: int
    total_bytes: int
    copied_bytes: int
    seconds: float
    waited: bool = False  # another process made the copy; this one waited for it
    found_in_place: int = 0  # files in DST but not journaled (a copy made otherwise), kept once their sha256 matched

    def summary(self) -> str:
        if self.waited:
            how = "copied by another process; waited for it"
        elif self.copied_bytes == 0:
            how = "already there, nothing copied"
        else:
            rate = format_bytes(self.copied_bytes / max(self.seconds, 1e-3))
            kept = self.total_bytes - self.copied_bytes
            how = (
                f"{format_bytes(self.copied_bytes)} copied in {self.seconds:.1f} s ({rate}/s)"
                + (f", {format_bytes(kept)} kept from an earlier run" if kept else "")
                + (f" ({self.found_in_place} file(s) of it found in place and checked)" if self.found_in_place else "")
            )
        return (
            f"{self.dst}: staged from {self.src}: {self.files} files, {format_bytes(self.total_bytes)}, "
            f"each checked against its sha256; {how}"
        )


def stage(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    jobs: int = DEFAULT_JOBS,
    overwrite: bool = False,
    progress: bool = False,
    stall_s: float = STALL_S,
) -> StageReport:
    """Copy the packed folder ``src`` to ``dst``; see the module docstring.

    ``jobs``: ranges copied at once, across files (uploads go ``copier.UPLOAD_FILES`` files at a time). ``overwrite``: replace a DST that
    holds another dataset (another manifest, or shards this one does not list). ``progress``: a
    tqdm bar in bytes. ``stall_s``: how long to wait for another stager of DST that shows no progress.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: need at least 1")
    start = time.monotonic()
    source, manifest_bytes = _open_src(src)
    target = _target(dst)
    _refuse_overlapping_folders(source, target)
    if target.manifest_bytes() == manifest_bytes:
        return _report(source, target, manifest_bytes, start)
    if isinstance(target, StoreTarget):
        target.prepare()
        return _copy(source, target, manifest_bytes, jobs=jobs, overwrite=overwrite, progress=progress, start=start)
    target.prepare()
    fd = lock_or_wait(target, manifest_bytes, stall_s)
    if fd is None:
        return _report(source, target, manifest_bytes, start, waited=True)
    try:
        if target.manifest_bytes() == manifest_bytes:  # the holder we waited for finished just before it let go
            return _report(source, target, manifest_bytes, start, waited=True)
        target.failure_path.unlink(missing_ok=True)
        try:
            return _copy(source, target, manifest_bytes, jobs=jobs, overwrite=overwrite, progress=progress, start=start)
        except Exception as e:
            record_failure(target, e)
            raise
    finally:
        release(fd)


def wait_for_stage(src: str | os.PathLike, dst: str | os.PathLike, *, stall_s: float = STALL_S) -> None:
    """Wait until another process of this launch (the trainer's local rank 0) has staged ``src`` into
    the local folder ``dst``; one line when it failed, died or stalls."""
    _, manifest_bytes = _open_src(src)
    wait_for_copy(LocalTarget(dst), manifest_bytes, str(src), stall_s)


def stage_on_node(src: str, dst: str, *, local_rank: int, progress: bool = False) -> None:
    """The trainer's ``data.stage``: local rank 0 stages ``src`` into ``dst``, the node's other ranks wait for it."""
    if local_rank == 0:
        report = stage(src, dst, progress=progress)
        logger.info("%s", report.summary())
    else:
        logger.debug("local rank %d: waiting for local rank 0 to stage %s into %s", local_rank, src, dst)
        wait_for_stage(src, dst)


# ----------------------------------------------------------------------------- the copy


def _copy(
    source: ByteSource, target: Target, manifest_bytes: bytes, *, jobs: int, overwrite: bool, progress: bool, start: float
) -> StageReport:
    manifest_where = source.where(MANIFEST_NAME)
    listed = manifest_files(parse_manifest(manifest_bytes, manifest_where), manifest_where)
    files = _sized(source, listed)
    present = target.sizes()
    _clear_the_way(source, target, {f.name for f in files}, present, overwrite)
    journal = target.entries()
    todo = [f for f in files if (f.name, f.size, f.sha256) not in journal or present.get(f.name) != f.size]
    rehash: list[StagedFile] = []
    if isinstance(target, LocalTarget):
        rehash = [f for f in todo if present.get(f.name) == f.size]  # in place but not journaled: hashing beats copying
        todo = [f for f in todo if f not in rehash]
        target.remove_parts()
        check_free_space(target.folder, sum(f.size for f in todo), what="the copy", error=DatasetError)
    total = sum(f.size for f in files)
    logger.debug(
        "stage %s -> %s: %d of %d files to copy, %d to check in place", source.location, target.location, len(todo), len(files), len(rehash)
    )
    scratch = (
        None if isinstance(target, LocalTarget) or isinstance(source, LocalSource) else Path(tempfile.mkdtemp(prefix="imgpipe-stage-"))
    )
    bar = tqdm(
        total=sum(f.size for f in todo + rehash),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="stage",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        copier = Copier(source, target, jobs=jobs, bar=bar, scratch=scratch)
        copier.run(todo, rehash)
    finally:
        bar.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    target.write_manifest(manifest_bytes)  # the commit point
    target.clear_journal()
    return StageReport(
        str(source.location),
        str(target.location),
        len(files),
        total,
        copier.copied_bytes,
        time.monotonic() - start,
        found_in_place=copier.found_in_place,
    )


def _sized(source: ByteSource, listed: list[ListedFile]) -> list[StagedFile]:
    """Each listed file with its size at the source; one line for a missing one, or one whose size differs from the manifest's."""
    sizes = source.list_sizes()
    files = []
    for item in listed:
        where = source.where(item.name)
        if sizes is not None:
            size = sizes.get(item.name)
        elif item.size is not None:  # no listing (plain HTTP): the manifest's size, checked by the copy
            size = item.size
        else:
            try:
                size = source.size(item.name)
            except FileNotFoundError:
                size = None
        if size is None:
            raise DatasetError(f"{where}: missing, though the manifest lists it; run 'imgpipe verify {source.location}'")
        if item.size is not None and size != item.size:
            raise DatasetError(
                f"{where}: {size} bytes, the manifest says {item.size}: the file at the source changed since packing; "
                f"run 'imgpipe verify {source.location}'"
            )
        files.append(staged(item, size))
    return files


def _clear_the_way(source: ByteSource, target: Target, names: set[str], present: dict[str, int], overwrite: bool) -> None:
    """Refuse a DST holding another dataset (or an unfinished pack); with ``overwrite``, remove that dataset's files."""
    if isinstance(target, LocalTarget) and (target.folder / JOURNAL_DIR).is_dir() and MANIFEST_NAME not in present:
        raise DatasetError(
            f"{unfinished_pack(target.folder) or f'{target.folder}: holds a pack journal ({JOURNAL_DIR}/)'}; stage into another DST"
        )
    others = sorted(n for n in present if n not in names and (n == MANIFEST_NAME or is_shard_file(n) or n.endswith(SIDECAR_SUFFIXES)))
    if not others:
        return
    if not overwrite:
        what = f"{'its own ' + MANIFEST_NAME if MANIFEST_NAME in others else others[0]}" + (
            f" and {len(others) - 1} more file(s)" if len(others) > 1 else ""
        )
        raise DatasetError(
            f"{target.location}: holds another dataset ({what} that {source.location}'s manifest does not match); "
            "choose an empty DST, or pass --overwrite to replace it"
        )
    if MANIFEST_NAME in others:
        target.remove_manifest()  # first: from here DST reads as an incomplete copy
    target.remove([n for n in others if n != MANIFEST_NAME])


# ----------------------------------------------------------------------------- opening


def _open_src(src: str | os.PathLike) -> tuple[ByteSource, bytes]:
    """SRC's byte source and its manifest's bytes; one line when SRC is not a packed folder."""
    if not is_url(src):
        folder = Path(src)
        if not folder.is_dir():
            raise DatasetError(
                f"{src}: {'not a folder' if folder.exists() else 'no such folder'}; give a folder made by 'imgpipe pack', or its URL"
            )
    source = open_source(str(src).rstrip("/") if is_url(src) else src)
    try:
        data = source.read_file(MANIFEST_NAME)
    except FileNotFoundError:
        unfinished = None if source.remote else unfinished_pack(src)
        raise DatasetError(
            unfinished or f"{source.where(MANIFEST_NAME)}: no manifest; is {source.location} a folder made by 'imgpipe pack'?"
        ) from None
    except OSError as e:
        raise DatasetError(f"{source.where(MANIFEST_NAME)}: cannot read the manifest ({e.strerror or e})") from None
    parse_manifest(data, source.where(MANIFEST_NAME))  # one line now for a manifest that is not one
    return source, data


def _target(dst: str | os.PathLike) -> Target:
    return StoreTarget(str(dst).rstrip("/")) if is_url(dst) else LocalTarget(dst)


def _refuse_overlapping_folders(source: ByteSource, target: Target) -> None:
    """One line when DST is SRC, or a folder inside it."""
    same = (
        source.location == target.location
        if source.remote or target.remote
        else isinstance(target, LocalTarget) and target.folder.exists() and os.path.samefile(source.location, target.folder)
    )
    if same:
        raise DatasetError(f"{target.location}: SRC and DST are the same folder; give another DST")
    if not (source.remote or target.remote) and Path(source.location).resolve() in Path(target.location).resolve().parents:
        raise DatasetError(
            f"{target.location}: DST is inside SRC {source.location}; a copy there would become part of the dataset it copies: "
            "give a DST outside it"
        )


def _report(source: ByteSource, target: Target, manifest_bytes: bytes, start: float, *, waited: bool = False) -> StageReport:
    """The report of a DST found complete (or completed by another stager)."""
    listed = manifest_files(parse_manifest(manifest_bytes, source.where(MANIFEST_NAME)))
    present = target.sizes()
    total = sum(present.get(item.name, 0) for item in listed)
    return StageReport(str(source.location), str(target.location), len(listed), total, 0, time.monotonic() - start, waited)
