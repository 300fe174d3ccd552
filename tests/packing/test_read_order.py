"""Pack reads its source in the order the storage holds it (files by disk offset, archive members front to back), with every
worker busy whatever the shard count, into the same output; a checkpoint it cannot trust is not used."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from _fs import tmpfs

from imgpipe._sys.fiemap import UNSUPPORTED, first_extent
from imgpipe.packing.filereads import READ_THREADS
from imgpipe.packing.journal import JOURNAL_DIR
from imgpipe.packing.packer import _plan, pack
from imgpipe.packing.progress import ProgressFile, progress_path
from imgpipe.packing.readorder import JOBS_PER_WORKER, MemberReads, ReadOrder
from imgpipe.packing.slots import ItemResults, SideFile, SlotMap
from imgpipe.synth.tree import make_synthetic

SYNTH = dict(classes=5, per_class=24, val_per_class=4, seed=3, quirks=True, min_side=24, max_side=40, progress=False)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("order") / "src"
    make_synthetic(root, workers=2, **SYNTH)  # type: ignore[arg-type]
    return root


def plan_of(src: Path, shards: str | int | None = None, workers: int = 2):
    return _plan(src, None, 256 * 10**6, shards, None, 95, True, 0, workers)


def place(path: Path) -> int:
    """Where the file's data lies on the disk (FIEMAP), or its inode where the file system cannot say (tmpfs)."""
    try:
        with open(path, "rb") as f:
            offset = first_extent(f.fileno())
    except OSError as e:
        assert e.errno in UNSUPPORTED
        return path.stat().st_ino
    return 2**63 - 1 if offset is None else offset


@pytest.mark.timeout(120)
def test_each_worker_reads_the_files_in_disk_order_and_the_output_does_not_change(tree: Path, tmp_path: Path) -> None:
    log = tmp_path / "reads.txt"
    spy = Path(__file__).parent / "_read_spy.py"
    command = [sys.executable, str(spy), "pack", str(tree), str(tmp_path / "out"), "--shards", "1", "--workers", "2", "--no-progress"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100, env={**os.environ, "READ_SPY_LOG": str(log)})
    assert result.returncode == 0, result.stderr
    pack(tree, tmp_path / "reference", shards=1, workers=1, progress=False)
    files = lambda dst: {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()}  # noqa: E731
    assert files(tmp_path / "out") == files(tmp_path / "reference")
    reads: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        pid, path = line.split("\t")
        reads.setdefault(pid, []).append(path)
    assert sorted(p for paths in reads.values() for p in paths) == sorted(map(str, tree.rglob("*.JPEG"))), "each file is read once"
    places = {str(p): place(p) for p in tree.rglob("*.JPEG")}
    for paths in reads.values():  # in disk order (but for the reads in flight at once, where threads read)
        order = [places[p] for p in paths]
        rank = np.argsort(np.argsort(order, kind="stable"), kind="stable")
        assert np.abs(rank - np.arange(len(order))).max() <= READ_THREADS, order


@pytest.mark.timeout(120)
def test_a_tree_on_a_tmpfs_is_read_by_inode_and_packs_the_same(tree: Path, tmp_path: Path) -> None:
    """tmpfs cannot say where a file lies (FIEMAP): the plan falls back on the inodes, and the shards are the disk's."""
    with tmpfs(tmp_path / "ram", "64m") as ram:
        shutil.copytree(tree, ram / "src")
        plan, _ = plan_of(ram / "src")
        for split in plan.splits.values():
            inodes = [os.stat(ram / "src" / path).st_ino for path in split.paths]
            assert split.places is not None and split.places.tolist() == inodes
        pack(ram / "src", tmp_path / "from-ram", workers=2, progress=False)
    pack(tree, tmp_path / "from-disk", workers=2, progress=False)
    files = lambda dst: {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file() and p.name != "manifest.json"}  # noqa: E731
    assert files(tmp_path / "from-ram") == files(tmp_path / "from-disk")


@pytest.mark.parametrize("workers", [1, 2, 16])
def test_one_shard_is_read_in_jobs_for_every_worker(tree: Path, workers: int) -> None:
    plan, root = plan_of(tree, shards=1)
    slot_map = SlotMap.of(plan, plan.shards, tree / "unused")
    groups = ReadOrder(plan, slot_map, root).groups(np.arange(len(slot_map)), workers)
    assert len(groups) >= min(len(slot_map), workers)
    assert max(map(len, groups)) == math.ceil(len(slot_map) / (workers * JOBS_PER_WORKER))  # the last jobs end near together
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(slot_map)))


@pytest.mark.parametrize("layout_name", ["wds", "kaggle-zip", "split-tar"])
def test_archive_members_are_read_front_to_back(layout_name: str, tmp_path: Path) -> None:
    make_synthetic(tmp_path / "src", layout=layout_name, **SYNTH)  # type: ignore[arg-type]
    plan, root = plan_of(tmp_path / "src", shards="train=3,val=2")
    slot_map = SlotMap.of(plan, plan.shards, tmp_path / "unused")
    order = ReadOrder(plan, slot_map, root)
    groups = order.groups(np.arange(len(slot_map)), 2)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(slot_map)))
    read: list[tuple[str, int]] = []
    for group in groups:
        reads = order.job(group).reads
        assert isinstance(reads, MemberReads)
        read += [(str(reads.spans.archives[a]), int(o)) for a, o in zip(reads.spans.archive, reads.spans.offsets)]
    for archive in {a for a, _ in read}:
        offsets = [o for a, o in read if a == archive]
        assert offsets == sorted(offsets), archive


def test_a_checkpoint_that_names_a_record_outside_its_slots_is_not_used(tree: Path, tmp_path: Path) -> None:
    plan, _ = plan_of(tree, shards=2)
    folder = tmp_path / JOURNAL_DIR
    folder.mkdir()
    slot_map = SlotMap.of(plan, plan.shards, folder / "slots")
    path = progress_path(folder, 0)
    fresh = np.zeros(len(slot_map.shards), bool)

    def saved(**changes: object) -> tuple[int, ItemResults]:
        results = ItemResults.empty(len(slot_map))
        results.done[:5], results.length[:5] = True, slot_map.lengths[:5]
        side = SideFile(folder / "side")
        ProgressFile(path, plan.fingerprint, slot_map, results, side, 0).save(np.ones(len(slot_map.shards), bool))
        if changes:
            with np.load(path) as data:
                arrays = {name: data[name] for name in data.files}
            for name, value in changes.items():
                arrays[name] = np.asarray(value, arrays[name].dtype) if name != "meta" else value
            np.savez(path, **arrays)  # type: ignore[arg-type]
        loaded = ItemResults.empty(len(slot_map))
        taken = ProgressFile(path, plan.fingerprint, slot_map, loaded, side, 0).load(fresh)
        side.close()
        return len(taken), loaded

    assert saved()[0] == 5
    assert saved(length=[*slot_map.lengths[:4], slot_map.lengths[4] + 1])[0] == 0  # longer than its slot, not in the side file
    assert saved(position=[0, 1, 2, 3, 10**9])[0] == 0  # outside its shard
    assert saved(side=[0, -1, -1, -1, -1])[0] == 0  # in a side file that holds nothing
    meta = {"fingerprint": "another plan", "side_bytes": 0, "shards": [s.name for s in slot_map.shards], "reasons": {}}
    assert saved(meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))[0] == 0
    fresh[slot_map.shard[0]] = True  # its slot file was laid out again: what it held is gone
    count, loaded = saved()
    assert count == 0 and not loaded.done.any()


@pytest.mark.timeout(120)
def test_the_members_of_many_small_archives_share_jobs_and_pack_the_same(tree: Path, tmp_path: Path) -> None:
    """ImageNet-21k's synset tars hold a few images each: one job per archive cost more to hand out than to read (3,000
    tars: 11-15 s with 2 workers against 1.3 s with 1). Jobs take the members of neighbouring archives, each front to
    back, and the output does not change."""
    src = tmp_path / "synsets"
    src.mkdir()
    images = sorted(tree.glob("train/*/*.JPEG"))
    for k in range(60):  # 60 class tars of 2 images each
        with tarfile.open(src / f"n{k:08d}.tar", "w") as archive:
            for image in images[2 * k : 2 * k + 2]:
                archive.add(image, image.name)
    plan, root = plan_of(src, shards=3)
    slot_map = SlotMap.of(plan, plan.shards, tmp_path / "unused")
    order = ReadOrder(plan, slot_map, root)
    groups = order.groups(np.arange(len(slot_map)), 2)
    assert len(groups) == 2 * JOBS_PER_WORKER  # 120 members in 8 jobs, not 60
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(slot_map)))
    read = [(str(reads.spans.archives[a]), int(o)) for reads in (order.job(g).reads for g in groups)
            for a, o in zip(reads.spans.archive, reads.spans.offsets)]  # type: ignore[union-attr]  # fmt: skip
    assert read == sorted(read)  # archive after archive, each front to back
    assert order.job(groups[0]).what == f"{src / 'n00000000.tar'} and 7 more archives"
    pack(src, tmp_path / "one", shards=3, workers=1, progress=False)
    pack(src, tmp_path / "two", shards=3, workers=2, progress=False)
    files = lambda dst: {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()}  # noqa: E731
    assert files(tmp_path / "one") == files(tmp_path / "two")
