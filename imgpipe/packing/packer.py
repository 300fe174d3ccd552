"""``imgpipe pack``: scan a source tree, plan shards, write them in parallel, resume, finalize.

Flow: ``ingest.scan`` -> ``plan.make_plan`` -> DST checked against the journal (same options, or
``--overwrite``) and for free space -> workers put each record into its planned slot (``scatter``), each
shard journaled once whole -> the sidecars and ``manifest.json``, last (``finalize``). Rule: a pack killed at any moment
and rerun with the same arguments ends byte-identical to an uninterrupted one. With ``num_nodes=N`` node
``i`` writes the shards whose global index is ``i mod N`` (``parts``); whichever node completes the
journal, or ``finalize=True``, writes the manifest.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from tqdm import tqdm

from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.diskinfo import check_free_space, warn_if_slow
from imgpipe._sys.oserrors import describe, write_probe
from imgpipe._sys.validate import MAX_SEED
from imgpipe.errors import DatasetError, PackError
from imgpipe.format.files import SIDECAR_SUFFIXES, is_shard_file
from imgpipe.format.manifest import MANIFEST_NAME, Skipped, load_manifest
from imgpipe.image import codec, shrink
from imgpipe.image.extensions import INSTALL_FIX
from imgpipe.ingest.scan import scan
from imgpipe.packing.finalize import changed_advice, changed_shards, final_names, missing_advice, write_manifest_from_journal
from imgpipe.packing.journal import JOURNAL_DIR, Journal, ShardResult, StoredPlan
from imgpipe.packing.parts import ArrayTask, Parts, choose_part
from imgpipe.packing.plan import DEFAULT_SHARD_SIZE, PackPlan, ShardSpec, make_plan, parse_shard_counts, parse_size
from imgpipe.packing.progress import CHECKPOINT_S
from imgpipe.packing.scatter import Scatter
from imgpipe.packing.slots import tmp_names

logger = logging.getLogger(__name__)

STALE_TMP_S = 600.0  # an atomic write takes milliseconds: a temp file this old belongs to a killed process
LISTINGS_DIR = "listings"
ARCHIVE_SUFFIXES = (".tar", ".zip", ".parquet", ".gz", ".tgz")


@dataclass
class PackReport:
    """What a pack run did. ``images``/``source_bytes``/``seconds`` cover the shards written by this run."""

    dst: Path
    records: dict[str, int] = field(default_factory=dict)  # per split; empty until the manifest is written
    skipped: list[Skipped] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)
    repairs: dict[str, int] = field(default_factory=dict)
    shards_total: int = 0
    shards_written: int = 0
    shards_reused: int = 0
    shards_pending: list[str] = field(default_factory=list)  # not yet written by any node
    images: int = 0
    source_bytes: int = 0
    seconds: float = 0.0
    manifest: Path | None = None

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.source_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def summary(self, show_skipped: int = 5) -> str:
        """A few lines for humans: records per split, skips with reasons, speed."""
        lines = []
        if self.manifest is not None:
            per_split = ", ".join(f"{split} {n:,}" for split, n in self.records.items())
            lines.append(f"packed {sum(self.records.values()):,} records ({per_split}) into {self.dst}")
        else:
            lines.append(
                f"wrote {self.shards_written} shard(s) into {self.dst}; {len(self.shards_pending)} still to be written by other nodes"
            )
        lines.append(
            f"shards: {self.shards_written} written, {self.shards_reused} already done, {self.shards_total} in the plan; "
            f"{self.images:,} images in {self.seconds:.1f} s ({self.images_per_s:,.0f} images/s, {self.mb_per_s:,.1f} MB/s)"
        )
        changed = {k: v for k, v in self.actions.items() if k != "kept" and v}
        if changed:
            lines.append("changed: " + ", ".join(f"{n:,} {action}" for action, n in changed.items()))
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} file(s):")
            lines += [f"  {s}" for s in self.skipped[:show_skipped]]
            if len(self.skipped) > show_skipped:
                lines.append(f"  ... and {len(self.skipped) - show_skipped} more (see 'imgpipe info {self.dst}')")
        return "\n".join(lines)


def pack(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    dst: str | os.PathLike,
    *,
    splits: Sequence[str] | None = None,
    shard_size: str | int | None = None,
    shards: str | int | None = None,
    workers: int | None = None,
    resize: int | None = None,
    quality: int = 95,
    shuffle: bool = True,
    seed: int = 0,
    overwrite: bool = False,
    strict: bool = False,
    num_nodes: int = 1,
    node_rank: int = 0,
    finalize: bool = False,
    array_task: ArrayTask | None = None,
    progress: bool = True,
    checkpoint_s: float = CHECKPOINT_S,
) -> PackReport:
    """Pack ``src`` into RecordIO shards in ``dst``; see the module docstring. Raises PackError/DatasetError.

    ``checkpoint_s``: how often the records written are made durable and recorded, so that a
    killed run loses at most that much work.

    ``src`` is a source folder, one image-net.org tar, or several of its files (tars, devkit,
    LOC_val_solution.csv) named one by one. ``array_task``, when given, picks the part instead
    of ``num_nodes``/``node_rank``.
    """
    started = time.monotonic()
    sources = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    src_paths, dst_path = [Path(os.path.abspath(p)) for p in sources], Path(os.path.abspath(dst))
    recorded = Journal(dst_path).read_parts() if array_task is not None else None
    num_nodes, node_rank, split = choose_part(num_nodes, node_rank, array_task, recorded)
    if array_task is not None:
        logger.info("part %d of %d, from %s (--num-nodes/--node-rank override it)", node_rank, num_nodes, array_task.describe())
    _check_arguments(src_paths, dst_path, workers, resize, quality, seed, num_nodes, node_rank, overwrite)
    if shard_size is not None and shards is not None:
        raise PackError("give --shards or --shard-size, not both")
    if not 0 <= checkpoint_s < float("inf"):
        raise PackError(f"--checkpoint-every {checkpoint_s}: give seconds, 0 or more")
    size = parse_size(shard_size if shard_size is not None else DEFAULT_SHARD_SIZE)
    cache = dst_path / JOURNAL_DIR / LISTINGS_DIR  # listings that cost a full read (.tar.gz, Parquet) are kept for reruns
    plan, src_path = _plan(
        src_paths[0] if len(src_paths) == 1 else src_paths, splits, size, shards, resize, quality, shuffle, seed, workers, cache
    )
    try:
        dst_path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PackError(f"DST {dst_path}: cannot make it: {describe(e, writing=True)}; or choose another DST") from None
    refused = write_probe(dst_path)
    if refused is not None:
        raise PackError(f"DST {dst_path}: cannot write there: {describe(refused, writing=True)}; or choose another DST")
    journal = Journal(dst_path)
    try:
        lock_fd = journal.lock(node_rank, whole_dst=overwrite)  # before anything in DST is read, written or deleted
    except PackError:
        parts = (journal.read_parts() or split).count
        if finalize and parts > 1 and journal.writer(node_rank) is not None:  # --finalize takes part 0's lock, held as part 0 writes
            pending = _pending(plan, journal)
            if pending:
                raise _pending_error(plan, journal, split, -1, dst_path, pending) from None
        raise
    try:
        if overwrite:
            remove_pack_outputs(dst_path)
        report = _check_journal(journal, plan, num_nodes)
        if report is None:
            if not finalize:
                journal.record_parts(split)
            report = PackReport(dst=dst_path, shards_total=len(plan.shards))
            mine = [] if finalize else [s for k, s in enumerate(plan.shards) if k % num_nodes == node_rank]
            _remove_stale_tmp(dst_path, mine, everything=num_nodes == 1 and not finalize)  # --finalize writes no shard
            published = final_names(plan, journal)
            todo = [s for s in mine if not _finished(journal, dst_path, s, published)]
            report.shards_reused = len(mine) - len(todo)

            def write(todo: list[ShardSpec]) -> None:
                needed = sum(int(plan.splits[s.split].sizes[s.start : s.stop].sum()) for s in todo)
                check_free_space(dst_path, needed, what=f"{len(todo)} shard(s) to write")
                warn_if_slow(dst_path)
                _warn_if_no_extension(resize)
                _write_shards(
                    plan, todo, src_path, dst_path, resize, quality, workers, progress, report, node_rank, checkpoint_s=checkpoint_s
                )

            if todo:
                write(todo)
            pending = _pending(plan, journal)
            if pending and (finalize or num_nodes == 1):
                raise _pending_error(plan, journal, split, node_rank, dst_path, pending)
            if not pending:  # the manifest is next: first every shard another run wrote must still be what it journaled
                # a rerun of a finished pack (its manifest written after this check) checks sizes; verify reads the bytes
                rerun = not todo and (dst_path / MANIFEST_NAME).exists()
                changed = changed_shards(plan, journal, dst_path, published, written={s.name for s in todo}, contents=not rerun)
                again = [(spec, why) for spec, why in changed if spec in mine]
                for spec, why in again:
                    logger.warning("%s: %s; writing it again", spec.name, why)
                if again:
                    write([spec for spec, _ in again])
                    report.shards_reused -= len(again)
                if len(again) < len(changed):
                    raise PackError(changed_advice(plan, journal, split, [(spec, why) for spec, why in changed if spec not in mine]))
            report.seconds = time.monotonic() - started
            report.shards_pending = pending
            if not pending:
                if num_nodes > 1 or finalize:  # every shard is journaled; what is left is a killed node's atomic-write temp file
                    _remove_stale_tmp(dst_path, plan.shards, everything=False, older_than_s=STALE_TMP_S)
                try:
                    done = write_manifest_from_journal(plan, journal, src_path, dst_path)
                except OSError as e:
                    raise PackError(
                        f"DST {dst_path}: writing the sidecars and {MANIFEST_NAME} failed: "
                        f"{f'{e.filename2 or e.filename}: ' if e.filename else ''}{describe(e, writing=True)}; "  # 2: a rename's target
                        "then rerun the same command to finish (every shard is written)"
                    ) from None
                report.manifest, report.skipped = done.path, done.manifest.skipped
                report.records = {name: split.records for name, split in done.manifest.splits.items()}
                report.actions, report.repairs = done.actions, done.repairs
    finally:
        os.close(lock_fd)
    logger.debug("%s", report.summary())
    if strict and report.skipped:
        first = report.skipped[0]
        raise PackError(
            f"--strict: {len(report.skipped)} source file(s) were skipped (first: {first}); fix or remove them, or pack without --strict"
        )
    return report


_NO_EXTENSION = (
    "imgpipe's C extension over libjpeg-turbo (imgpipe.image._jpeg_shrink) is not built: pack checks every kept JPEG "
    f"with Pillow's whole decode%s, several times slower; {INSTALL_FIX}"
)


def _warn_if_no_extension(resize: int | None) -> None:
    """Say once per pack that the slow path is taken when the C extension is missing (kept bytes come out the same)."""
    slow_resize = resize is not None and not shrink.available()
    if not codec.scan_check_built() or slow_resize:
        logger.warning(_NO_EXTENSION, " and --resize resizes with Pillow (other, equally valid bytes)" if slow_resize else "")


def _check_arguments(
    srcs: Sequence[Path],
    dst: Path,
    workers: int | None,
    resize: int | None,
    quality: int,
    seed: int,
    num_nodes: int,
    node_rank: int,
    overwrite: bool,
) -> None:
    for src in srcs:
        archive = src.name.lower().endswith(ARCHIVE_SUFFIXES) or src.suffix[1:].isdigit()
        if not src.exists() or (not src.is_dir() and len(srcs) == 1 and not archive):
            what = "is a file, not a folder or an archive" if src.exists() else "no such folder or file"
            raise PackError(
                f"SRC {src}: {what}; give the ImageNet root, the Kaggle download or its zip, a folder of class folders, "
                "image-net.org's tars, Hugging Face's Parquet files or tarballs, or WebDataset shards"
            )
        real_src, real_dst = Path(os.path.realpath(src)), Path(os.path.realpath(dst))
        if src.is_dir() and (real_dst == real_src or real_src in real_dst.parents):
            raise PackError(f"DST {dst} is inside SRC {src}; choose a DST outside the source tree")
    existing = next((p for p in (dst, *dst.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise PackError(f"DST {dst}: {existing} is a file, not a folder; choose another DST")
    if workers is not None and workers < 1:
        raise PackError(f"--workers {workers}: need at least 1")
    if resize is not None and resize < 1:
        raise PackError(f"--resize {resize}: the shorter side must be at least 1 pixel")
    if not 1 <= quality <= 100:
        raise PackError(f"--quality {quality}: use a JPEG quality from 1 to 100")
    if not 0 <= seed <= MAX_SEED:
        raise PackError(f"--seed {seed}: use a seed from 0 to {MAX_SEED}")
    if num_nodes < 1:
        raise PackError(f"--num-nodes {num_nodes}: need at least 1 machine")
    if not 0 <= node_rank < num_nodes:
        raise PackError(f"--node-rank {node_rank} must be in 0..{num_nodes - 1} (--num-nodes {num_nodes})")
    if overwrite and num_nodes > 1:
        raise PackError(
            "--overwrite with --num-nodes > 1 would let one node delete another's shards; empty DST once before starting the nodes"
        )


def _plan(
    src: str | os.PathLike | Sequence[Path],
    splits: Sequence[str] | None,
    shard_size: int,
    shards: str | int | None,
    resize: int | None,
    quality: int,
    shuffle: bool,
    seed: int,
    workers: int | None,
    cache: Path | None = None,
) -> tuple[PackPlan, Path]:
    """The plan, and the source root its paths are relative to."""
    try:
        tree = scan(src, splits, workers, cache)
    except OSError as e:  # a class folder, LOC_val_solution.csv or tar that cannot be read
        raise DatasetError(f"SRC {e.filename or src}: cannot read it: {describe(e, writing=False)}; then rerun") from None
    items = {name: (s.paths, s.labels) for name, s in tree.splits.items() if len(s.paths)}
    for name in tree.splits.keys() - items.keys():
        logger.warning("split %s has no images in %s; it is left out", name, src)
    if not items:
        raise PackError(f"SRC {src}: no images found ({tree.layout} layout); check the path and the file extensions")
    counts = parse_shard_counts(shards, list(items))
    size = None if counts is not None else shard_size
    options: dict[str, Any] = {
        "splits": list(items),
        "shard_size": size,
        "shards": counts,
        "resize": resize,
        "quality": quality,
        "shuffle": shuffle,
        "seed": seed,
    }
    if resize is not None:  # the two resizers give other bytes: a pack is never resumed with the other one
        options["resizer"] = shrink.resizer()
    spans = {name: s.spans for name, s in tree.splits.items() if s.spans is not None and name in items}
    plan = make_plan(
        tree.root, tree.classes, items, options=options, shard_size=shard_size, shard_counts=counts, shuffle=shuffle, seed=seed, spans=spans
    )
    unread = plan.rejected  # left out by the plan, after those the scan left out
    plan.rejected = {name: s.rejected + unread.get(name, []) for name, s in tree.splits.items() if s.rejected or unread.get(name)}
    plan.layout = tree.layout
    return plan, tree.root


def _check_journal(journal: Journal, plan: PackPlan, num_nodes: int) -> PackReport | None:
    """Refuse a DST packed with other options; start a journal in an unused DST.

    A finished pack whose journal is gone (copied without dot-folders) is recognised from its
    manifest: with the same options and source it is complete, and its report is returned.
    """
    restart = (
        "empty DST (or choose another), then start every node again with the same options"
        if num_nodes > 1
        else "pass --overwrite to start again"
    )
    stored = journal.read_plan()
    if stored is None and (journal.dst / MANIFEST_NAME).exists():
        manifest = load_manifest(journal.dst)
        stored = StoredPlan(manifest.options, manifest.fingerprint or plan.fingerprint, len(plan.shards))
        source = f" (from its {MANIFEST_NAME}; the journal {JOURNAL_DIR}/ is gone)"
    elif stored is None:
        leftovers = [p.name for p in journal.dst.iterdir() if _is_pack_output(p.name) and p.name != JOURNAL_DIR]
        leftovers += [f"{JOURNAL_DIR}/{p.name}" for p in journal.folder.iterdir() if not p.name.endswith((".lock", ".tmp"))
                      and p.name != LISTINGS_DIR]  # fmt: skip
        if leftovers:
            raise PackError(f"DST {journal.dst} already holds packed files ({leftovers[0]}) from an unknown pack: {restart}")
        journal.write_plan(plan.options, plan.fingerprint, len(plan.shards))
        return None
    else:
        manifest, source = None, ""
    if stored.options != plan.options:
        diffs = [f"{k} {stored.options.get(k)!r} -> {v!r}" for k, v in plan.options.items() if stored.options.get(k) != v]
        raise PackError(f"DST {journal.dst} was packed with different options ({'; '.join(diffs)}){source}: {restart}")
    if stored.fingerprint != plan.fingerprint:
        raise PackError(
            f"DST {journal.dst} was packed from a different source tree (files added, removed or changed size since){source}: {restart}"
        )
    if manifest is None:
        return None
    logger.warning(
        "%s: %s holds a finished pack with these options; nothing to do ('imgpipe verify' checks it)", journal.dst, MANIFEST_NAME
    )
    records = {name: split.records for name, split in manifest.splits.items()}
    shards = sum(len(split.shards) for split in manifest.splits.values())
    return PackReport(
        journal.dst,
        records=records,
        skipped=manifest.skipped,
        shards_total=shards,
        shards_reused=shards,
        manifest=journal.dst / MANIFEST_NAME,
    )


def _is_pack_output(name: str) -> bool:
    return name == MANIFEST_NAME or name == JOURNAL_DIR or is_shard_file(name) or name.endswith(SIDECAR_SUFFIXES)


def _pending(plan: PackPlan, journal: Journal) -> list[str]:
    """The planned shards not yet journaled."""
    return [s.name for s in plan.shards if journal.read_entry(s.name) is None]


def _pending_error(plan: PackPlan, journal: Journal, split: Parts, node_rank: int, dst: Path, pending: list[str]) -> PackError:
    """What to do about the ``pending`` shards (``node_rank``: the part this run writes, -1 for none)."""
    advice = missing_advice(plan, journal, split, node_rank)
    return PackError(f"{dst}: {len(pending)} shard(s) are not written yet (e.g. {pending[0]}); {advice}")


def remove_pack_outputs(dst: Path) -> None:
    """Delete what a pack writes in ``dst`` (shards, sidecars, manifest, journal, temp files); nothing else.

    The journal's lock files stay: the caller holds one of them.
    """
    for path in dst.iterdir():
        if path.name == JOURNAL_DIR:
            for entry in path.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry)
                elif not entry.name.endswith(".lock"):
                    entry.unlink()
        elif _is_pack_output(path.name) or (path.name.startswith(".") and path.name.endswith(".tmp")):
            path.unlink()


def _remove_stale_tmp(dst: Path, mine: Iterable[ShardSpec], everything: bool, older_than_s: float = 0.0) -> None:
    """Remove temp files a killed run left: of this node's shards, or every temp file when no
    other node can be writing (single node), or those older than ``older_than_s`` seconds."""
    stale = [p for spec in mine for p in tmp_names(dst, spec)]
    if everything or older_than_s:
        stale += [p for folder in (dst, dst / JOURNAL_DIR) if folder.is_dir() for p in folder.glob(".*.tmp")]
    now = time.time()
    for path in stale:
        try:
            if everything or not older_than_s or now - path.stat().st_mtime > older_than_s:
                logger.debug("removing %s left by an interrupted run", path)
                path.unlink()
        except FileNotFoundError:
            continue


def _finished(journal: Journal, dst: Path, spec: ShardSpec, published: dict[str, str]) -> bool:
    """A shard is done when it is journaled and both files have the journaled sizes, under the
    planned name or (once finalize renumbered the shards) the published one; or when it is
    journaled without records (every item skipped: it has no files)."""
    entry = journal.read_entry(spec.name)
    if entry is None:
        return False
    if entry.records == 0:
        return True
    for name in dict.fromkeys([spec.name, published.get(spec.name, spec.name)]):
        try:
            sizes = ((dst / f"{name}.rec").stat().st_size, (dst / f"{name}.idx").stat().st_size)
        except FileNotFoundError:
            continue
        if sizes == (entry.bytes, entry.index_bytes):
            return True
    logger.warning("%s: journaled but its files are missing or changed size; writing it again", spec.name)
    journal.entry_path(spec.name).unlink(missing_ok=True)
    return False


# ----------------------------------------------------------------------------- writing


def _write_shards(
    plan: PackPlan,
    todo: Sequence[ShardSpec],
    src: Path,
    dst: Path,
    resize: int | None,
    quality: int,
    workers: int | None,
    progress: bool,
    report: PackReport,
    node_rank: int = 0,
    checkpoint_s: float = CHECKPOINT_S,
) -> None:
    """Write ``todo``: the source read in storage order, every record put into its planned slot (``scatter``)."""
    workers = workers or available_cpus()
    total_bytes = sum(int(plan.splits[s.split].sizes[s.start : s.stop].sum()) for s in todo)
    bar = tqdm(total=sum(s.items for s in todo), unit="img", desc="pack", disable=not progress, dynamic_ncols=True, smoothing=0.1)
    started = time.monotonic()
    done_bytes = [0]

    def advance(images: int, nbytes: int) -> None:
        done_bytes[0] += nbytes
        elapsed = max(time.monotonic() - started, 1e-9)
        bar.set_postfix_str(f"{done_bytes[0] / 1e6 / elapsed:.1f} MB/s of {total_bytes / 1e6:,.0f} MB", refresh=False)
        bar.update(images)

    logger.info("writing %d shard(s) of %d with %d worker(s) into %s", len(todo), report.shards_total, workers, dst)
    try:
        scatter = Scatter(plan, todo, src, dst, resize=resize, quality=quality, node_rank=node_rank, advance=advance,
                          collect=lambda result: _collect(result, report), checkpoint_s=checkpoint_s)  # fmt: skip
        scatter.run(workers)
    except BaseException:
        for spec in todo:
            if Journal(dst).read_entry(spec.name) is None:
                for path in tmp_names(dst, spec):
                    path.unlink(missing_ok=True)
        raise
    finally:
        bar.close()


def _collect(result: ShardResult, report: PackReport) -> None:
    report.shards_written += 1
    report.images += result.records + len(result.skipped)
    report.source_bytes += result.source_bytes
