"""A FIFO (a read would wait for a writer forever) or a link to /dev/zero (an endless read) put where imgpipe reads back
a file it wrote: the pack journal, a manifest, a sidecar, a shard, a stage's or a cache's state, a checkpoint. Each is
named in one line, or, where the file is only a hint, passed over; never read, so no command waits or fills memory."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from imgpipe.cache.checkout import attach
from imgpipe.cache.nodecache import SOURCE_NAME, STATE_DIR, cached_version
from imgpipe.errors import ConfigError, DatasetError, PackError
from imgpipe.format.info import describe
from imgpipe.format.verify import verify
from imgpipe.packing.journal import JOURNAL_DIR, PARTS_NAME
from imgpipe.packing.packer import pack
from imgpipe.packing.progress import progress_path
from imgpipe.staging.stager import stage
from imgpipe.staging.target import LocalTarget
from imgpipe.staging.waiting import _read_failure
from imgpipe.train.checkpoint_file import load_checkpoint

KINDS = {"fifo": "a FIFO", "device": "a character device"}
pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("kind", list(KINDS))]


def not_a_file(path: Path, kind: str) -> str:
    """Put a FIFO without a writer, or a link to /dev/zero, where ``path`` was; what imgpipe calls it."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return f"not a regular file but {KINDS[kind]}"


def copy(packed_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed_dir, tmp_path / "packed"))


@pytest.mark.parametrize("name", [PARTS_NAME, "plan.json", "train-00000-of-00004.json"])
def test_a_journal_file_is_one_pack_error(synth_tree: Path, tmp_path: Path, name: str, kind: str) -> None:
    dst = tmp_path / "out"
    pack(synth_tree, dst, shards=4, num_nodes=2, node_rank=0, workers=1, progress=False)
    what = not_a_file(dst / JOURNAL_DIR / name, kind)
    with pytest.raises(PackError) as info:
        pack(synth_tree, dst, shards=4, num_nodes=2, node_rank=1, workers=1, progress=False)
    file = "journal entry" if name.startswith("train") else "pack journal"
    assert str(info.value).startswith(f"{dst / JOURNAL_DIR / name}: cannot read the {file} ({what}); ")
    with pytest.raises(DatasetError, match=r"incomplete pack"):
        describe(dst)  # info and verify read the plan as a hint


def test_a_pack_checkpoint_is_read_past_with_a_warning(
    synth_tree: Path, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    dst = tmp_path / "out"
    pack(synth_tree, dst, shards=4, num_nodes=2, node_rank=0, workers=1, progress=False)
    what = not_a_file(progress_path(dst / JOURNAL_DIR, 1), kind)
    with caplog.at_level(logging.WARNING):
        assert pack(synth_tree, dst, shards=4, num_nodes=2, node_rank=1, workers=1, progress=False).manifest is not None
    assert f"unreadable checkpoint ({what}: " in caplog.text


@pytest.mark.parametrize("command", ["info", "verify"])
def test_a_manifest_is_one_line_in_the_cli(packed_dir: Path, tmp_path: Path, kind: str, command: str) -> None:
    dst = copy(packed_dir, tmp_path)
    what = not_a_file(dst / "manifest.json", kind)
    result = subprocess.run([sys.executable, "-m", "imgpipe", command, str(dst)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr == f"imgpipe: error: {dst / 'manifest.json'}: cannot read the manifest ({what})\n"


@pytest.mark.parametrize("name", ["val.labels.npy", "val.sources.txt", "val-00000-of-00001.rec", "val-00000-of-00001.idx"])
def test_verify_names_a_sidecar_or_a_shard_file(packed_dir: Path, tmp_path: Path, kind: str, name: str) -> None:
    dst = copy(packed_dir, tmp_path)
    what = not_a_file(dst / name, kind)
    report = verify(dst, workers=1, progress=False)
    assert not report.ok and any(p.file == name and what in p.message for p in report.problems), report.problems


def test_a_stage_dst_manifest_is_one_line(packed_dir: Path, tmp_path: Path, kind: str) -> None:
    dst = tmp_path / "dst"
    dst.mkdir()
    what = not_a_file(dst / "manifest.json", kind)
    with pytest.raises(DatasetError, match=rf"^{dst / 'manifest.json'}: cannot read it \({what}\); move it away, or choose"):
        stage(packed_dir, dst, progress=False)


def test_the_state_files_read_as_hints_are_passed_over(tmp_path: Path, kind: str) -> None:
    """A stage's failure record and a node cache's source: as if there were none."""
    target = LocalTarget(tmp_path / "dst")
    target.journal.mkdir(parents=True)
    not_a_file(target.failure_path, kind)
    assert _read_failure(target, 0.0) is None
    cache = tmp_path / "cache"
    (cache / STATE_DIR).mkdir(parents=True)
    not_a_file(cache / STATE_DIR / SOURCE_NAME, kind)
    assert cached_version(cache) is None and attach(cache) is None


def test_a_training_checkpoint_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "checkpoint.pt"
    torch.save({"format_version": 1}, path)
    what = not_a_file(path, kind)
    with pytest.raises(ConfigError, match=rf"^{path}: cannot read the checkpoint \({what}\); move it away"):
        load_checkpoint(path)


@pytest.mark.parametrize("name", ["train.labels.npy", "train.index.npy"])
def test_a_sidecar_opened_by_the_loaders_is_one_line(packed_dir: Path, tmp_path: Path, kind: str, name: str) -> None:
    """open_shardset (what both loaders open) reads the index and labels sidecars back only as regular files."""
    from imgpipe.format.shardset import open_shardset

    dst = copy(packed_dir, tmp_path)
    what = not_a_file(dst / name, kind)
    with pytest.raises(DatasetError, match=rf"^{dst / name}: unreadable .* sidecar \({what}: .*\); rerun 'imgpipe pack'$"):
        open_shardset(dst, "train")


def test_a_manifest_opened_by_the_loaders_is_one_line(packed_dir: Path, tmp_path: Path, kind: str) -> None:
    """A manifest.json that is not a regular file (or a folder) is the line verify and info give; the loaders opened
    the folder as bare shards without it, skipping every check the manifest holds."""
    from imgpipe.format.shardset import open_shardset

    dst = copy(packed_dir, tmp_path)
    what = not_a_file(dst / "manifest.json", kind)
    with pytest.raises(DatasetError, match=rf"^{dst / 'manifest.json'}: cannot read the manifest \({what}\)$"):
        open_shardset(dst, "train")
    (dst / "manifest.json").unlink()
    (dst / "manifest.json").mkdir()
    with pytest.raises(DatasetError, match=rf"^{dst / 'manifest.json'}: cannot read the manifest \(Is a directory\)$"):
        open_shardset(dst, "train")
