"""The end of a pack: once every shard is journaled, the sidecars and ``manifest.json`` from the journal.

Before that, a pack in parts checks the shards other runs wrote against their journal entries (a shard
changed since is journaled no more), and says which parts are still being written, missing, or must
write a shard again.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from imgpipe._sys.atomic import fsync_dir
from imgpipe._sys.checksum import sha256_file
from imgpipe._sys.cpus import available_cpus
from imgpipe.errors import PackError, RecordIOError
from imgpipe.format import recordio
from imgpipe.format.files import (
    checksums_bytes,
    checksums_name,
    index_bytes,
    index_name,
    labels_bytes,
    labels_name,
    sources_bytes,
    sources_name,
    write_sidecar,
)
from imgpipe.format.manifest import MANIFEST_NAME, Manifest, ShardInfo, Skipped, SplitInfo, write_manifest
from imgpipe.packing.journal import Journal, ShardResult
from imgpipe.packing.parts import Parts, missing_parts_advice, rerun_parts_advice
from imgpipe.packing.plan import PackPlan, ShardSpec, published_names

logger = logging.getLogger(__name__)


class Finalized(NamedTuple):
    """What ``write_manifest_from_journal`` wrote: the manifest and where, and the journal's counts of what happened to the items."""

    path: Path
    manifest: Manifest
    actions: dict[str, int]
    repairs: dict[str, int]


def missing_advice(plan: PackPlan, journal: Journal, split: Parts, node_rank: int) -> str:
    """What to do about the shards not yet journaled: wait for the parts still being written (their
    node's lock is held, by another process than this one), run the others, by the recorded split."""
    split = journal.read_parts() or split
    if split.count == 1:
        return "rerun the same command to write them"
    missing = sorted({k % split.count for k, spec in enumerate(plan.shards) if journal.read_entry(spec.name) is None})
    writers = {part: writer for part in missing if part != node_rank and (writer := journal.writer(part)) is not None}
    running = "; ".join(f"part {part} of {split.count} is still being written ({writer})" for part, writer in writers.items())
    absent = [part for part in missing if part not in writers]
    wait = f"wait for {'it' if len(writers) == 1 else 'them'} to finish"
    if not absent:
        return f"{running}; {wait}, then --finalize"
    return (f"{running}, {wait}; " if running else "") + missing_parts_advice(split, absent)


def changed_shards(
    plan: PackPlan, journal: Journal, dst: Path, published: dict[str, str], written: set[str], contents: bool = True
) -> list[tuple[ShardSpec, str]]:
    """The journaled shards, other than those this run ``written``, whose .rec or .idx no longer has its journaled
    size and (with ``contents``) sha256, and why; their journal entries are removed, so the part that writes each
    writes it again."""

    def check(spec: ShardSpec) -> str | None:
        entry = journal.read_entry(spec.name)
        if entry is None or entry.records == 0:
            return None
        names = list(dict.fromkeys([published.get(spec.name, spec.name), spec.name]))
        name = next((n for n in names if (dst / f"{n}.rec").exists()), names[0])
        files = ((f"{name}.rec", entry.bytes, entry.sha256), (f"{name}.idx", entry.index_bytes, entry.index_sha256))
        for path, size, sha in ((dst / file, size, sha) for file, size, sha in files):
            try:
                found = path.stat().st_size
                if found != size:
                    return f"{path.name} is {found} bytes, the journal says {size}"
                if contents and sha256_file(path) != sha:
                    return f"{path.name}'s sha256 differs from the journal's"
            except FileNotFoundError:
                return f"{path.name} is missing"
        return None

    others = [spec for spec in plan.shards if spec.name not in written]
    if others:
        checked = "size, sha256" if contents else "size"
        logger.info("checking %d shard(s) written by other runs against the journal (%s)", len(others), checked)
    with ThreadPoolExecutor(max(1, min(len(others), available_cpus()))) as threads:  # sha256 releases the GIL
        changed = [(spec, why) for spec, why in zip(others, threads.map(check, others)) if why is not None]
    for spec, _ in changed:
        journal.entry_path(spec.name).unlink(missing_ok=True)
    return changed


def changed_advice(plan: PackPlan, journal: Journal, split: Parts, changed: list[tuple[ShardSpec, str]]) -> str:
    """One line: the first shard that changed since its part wrote it, and the part(s) to run again."""
    split = journal.read_parts() or split
    spec, why = changed[0]
    index = {s.name: k for k, s in enumerate(plan.shards)}
    parts = sorted({index[s.name] % split.count for s, _ in changed})
    what = f"shard {spec.name} changed since it was written ({why}; {len(changed)} shard(s) in all); no {MANIFEST_NAME} was written"
    if split.count == 1:
        return f"{journal.dst}: {what}; rerun the same command without --finalize to write it again"
    names = ", ".join(map(str, parts))
    return f"{journal.dst}: {what}; part(s) {names} of {split.count} must write it again: {rerun_parts_advice(split, parts)}"


def final_names(plan: PackPlan, journal: Journal) -> dict[str, str]:
    """Planned -> published shard names, for every split whose shards are all journaled."""
    names: dict[str, str] = {}
    for split in plan.splits.values():
        entries = [journal.read_entry(spec.name) for spec in split.shards]
        if all(entry is not None for entry in entries):
            names.update(published_names(split, [entry.records for entry in entries if entry is not None]))
    return names


def write_manifest_from_journal(plan: PackPlan, journal: Journal, src: Path, dst: Path) -> Finalized:
    """Write the sidecars and the manifest from the journal (deterministic bytes)."""
    splits: dict[str, SplitInfo] = {}
    skipped: list[Skipped] = []
    actions: Counter[str] = Counter()
    repairs: Counter[str] = Counter()
    published = final_names(plan, journal)
    for name, split in plan.splits.items():
        kept: list[np.ndarray] = []
        crcs: list[np.ndarray] = []
        indexes: list[tuple[np.ndarray, np.ndarray]] = []
        shard_infos = []
        for spec in split.shards:
            entry = journal.read_entry(spec.name)
            if entry is None:
                raise PackError(f"{journal.entry_path(spec.name)}: journal entry vanished while finalizing; rerun the pack")
            misfit = _misfit(entry, spec)
            if misfit is not None:
                where = journal.entry_path(spec.name)
                raise PackError(f"{where}: journal entry unlike its shard ({misfit}); delete it to rewrite that shard")
            final = published.get(spec.name)
            _publish(dst, spec, final)
            skipped += [Skipped(name, split.paths[pos], reason) for pos, reason in entry.skipped]
            actions.update(entry.actions)
            repairs.update(entry.repairs)
            if final is None:
                continue
            gone = {pos for pos, _ in entry.skipped}
            positions = np.array([p for p in range(spec.start, spec.stop) if p not in gone], dtype=np.int64)
            kept.append(positions)
            crcs.append(np.array(entry.crc32, dtype=np.uint32))
            indexes.append(_read_published_index(dst / f"{final}.idx"))
            shard_infos.append(
                ShardInfo(f"{final}.rec", f"{final}.idx", entry.records, entry.bytes, entry.sha256, entry.index_bytes, entry.index_sha256)
            )
        fsync_dir(dst)
        if not shard_infos:
            logger.warning("split %s: every image was skipped; the split is left out", name)
            continue
        if len(shard_infos) < len(split.shards):
            logger.warning(
                "split %s: %d of %d planned shard(s) held only skipped images and are left out; the other %d are numbered -of-%05d",
                name,
                len(split.shards) - len(shard_infos),
                len(split.shards),
                len(shard_infos),
                len(shard_infos),
            )
        order = np.concatenate(kept)
        splits[name] = SplitInfo(
            shards=shard_infos,
            sources=sources_name(name),
            sources_sha256=write_sidecar(dst / sources_name(name), sources_bytes([split.paths[p] for p in order.tolist()])),
            labels=labels_name(name),
            labels_sha256=write_sidecar(dst / labels_name(name), labels_bytes(split.labels[order])),
            checksums=checksums_name(name),
            checksums_sha256=write_sidecar(dst / checksums_name(name), checksums_bytes(np.concatenate(crcs))),
            index_sidecar=index_name(name),
            index_sidecar_sha256=write_sidecar(
                dst / index_name(name), index_bytes(np.concatenate([k for k, _ in indexes]), np.concatenate([o for _, o in indexes]))
            ),
        )
    skipped += [Skipped(name, path, reason) for name, rejected in plan.rejected.items() for path, reason in rejected]
    if not splits:
        raise PackError(f"every source image was skipped (first: {skipped[0]}); nothing to pack")
    manifest = Manifest(
        classes=plan.classes,
        splits=splits,
        options=plan.options,
        source=str(src),
        skipped=skipped,
        fingerprint=plan.fingerprint,
        layout=plan.layout,
    )
    return Finalized(write_manifest(dst, manifest), manifest, dict(sorted(actions.items())), dict(sorted(repairs.items())))


def _misfit(entry: ShardResult, spec: ShardSpec) -> str | None:
    """Why a well-formed journal entry cannot be the planned shard ``spec``'s, or None."""
    skipped = [pos for pos, _ in entry.skipped]
    if entry.name != spec.name:
        return f"it names {entry.name}"
    if entry.records + len(skipped) != spec.items:
        return f"{entry.records} records and {len(skipped)} skipped, the plan has {spec.items} items"
    if len(set(skipped)) != len(skipped) or not all(spec.start <= pos < spec.stop for pos in skipped):
        return f"its skipped positions are not {len(skipped)} of {spec.start}..{spec.stop - 1}"
    return None


def _read_published_index(idx: Path) -> tuple[np.ndarray, np.ndarray]:
    """A written shard's .idx as (keys, offsets), for the split's index sidecar."""
    try:
        return recordio.read_index(idx)
    except (OSError, RecordIOError) as e:
        raise PackError(f"{idx}: cannot read the shard's index back ({e}); rerun the pack") from None


def _publish(dst: Path, spec: ShardSpec, final: str | None) -> None:
    """Give a written shard its published name, or delete it when it holds no records (``final`` None).

    Idempotent, so a finalize killed half-way is simply run again.
    """
    for ext in ("rec", "idx"):
        planned = dst / f"{spec.name}.{ext}"
        if final is None:
            planned.unlink(missing_ok=True)
        elif final != spec.name and planned.exists():
            os.replace(planned, dst / f"{final}.{ext}")
