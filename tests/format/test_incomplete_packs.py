"""A folder is complete only when its manifest exists: verify and open_shards on unfinished packs,
and the split of a folder without a manifest comes from file names only."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgpipe.errors import DatasetError
from imgpipe.format.shardset import open_shardset
from imgpipe.packing.journal import JOURNAL_DIR


def imgpipe(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imgpipe", *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(120)
def test_verify_refuses_one_node_of_a_two_node_pack(synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    node = imgpipe("pack", synth_tree, dst, "--shards", "train=3,val=2", "--num-nodes", "2", "--node-rank", "1", "--workers", "1")
    assert node.returncode == 0, node.stderr
    result = imgpipe("verify", dst, "--workers", "1")
    assert result.returncode == 1, result.stdout
    assert f"{dst}: incomplete pack: 3 of 5 shards missing, no manifest.json; rerun the same 'imgpipe pack'" in result.stdout
    with pytest.raises(DatasetError, match="incomplete pack: 3 of 5 shards missing"):
        open_shardset(dst)
    info = imgpipe("info", dst)
    assert info.returncode == 1 and f"imgpipe: error: {dst}: incomplete pack: 3 of 5 shards missing" in info.stderr


@pytest.mark.timeout(60)
def test_verify_refuses_a_pack_whose_manifest_is_gone(packed_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    shutil.copytree(packed_dir, dst)
    (dst / "manifest.json").unlink()
    result = imgpipe("verify", dst, "--workers", "1")
    assert result.returncode == 1, result.stdout
    assert "incomplete pack: all 3 shards written, no manifest.json" in result.stdout
    shutil.rmtree(dst / JOURNAL_DIR)  # no journal: bare .rec/.idx pairs, checked as they are
    assert imgpipe("verify", dst, "--workers", "1").returncode == 0


def test_a_folder_without_manifest_keeps_its_splits_apart(packed_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    shutil.copytree(packed_dir, dst, ignore=shutil.ignore_patterns("manifest.json", JOURNAL_DIR))
    train, val = open_shardset(dst, "train"), open_shardset(dst, "val")
    assert (len(train), len(val)) == (48, 12)
    assert {p.name.split("-")[0] for p in train.rec_paths} == {"train"}
    assert [p.name for p in val.rec_paths] == ["val-00000-of-00001.rec"]
    with pytest.raises(DatasetError, match=r"no test-NNNNN-of-NNNNN.rec or test.rec for split 'test' \(the file names give: train, val\)"):
        open_shardset(dst, "test")


def test_im2rec_names_give_the_split(packed_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    for name in ("train", "val"):
        shard = f"{name}-00000-of-0000{2 if name == 'train' else 1}"
        shutil.copy(packed_dir / f"{shard}.rec", dst / f"{name}.rec")
        shutil.copy(packed_dir / f"{shard}.idx", dst / f"{name}.idx")
    assert [p.name for p in open_shardset(dst, "val").rec_paths] == ["val.rec"]
    assert [p.name for p in open_shardset(dst).rec_paths] == ["train.rec"]
    (dst / "val.rec").rename(dst / "data.rec")
    (dst / "val.idx").rename(dst / "data.idx")
    with pytest.raises(DatasetError, match=r"the file names give: data, train\); pass the .rec files themselves"):
        open_shardset(dst, "val")
    assert len(open_shardset(dst / "data.rec", "val")) == 12


@pytest.mark.timeout(60)
def test_a_refused_pack_leaves_bare_pairs_bare(packed_dir: Path, synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    for ext in ("rec", "idx"):
        shutil.copy(packed_dir / f"val-00000-of-00001.{ext}", dst / f"val-00000-of-00001.{ext}")
    refused = imgpipe("pack", synth_tree, dst)
    assert refused.returncode == 1 and "from an unknown pack: pass --overwrite" in refused.stderr
    result = imgpipe("verify", dst, "--workers", "1")
    assert result.returncode == 0, result.stdout
    assert len(open_shardset(dst, "val")) == 12


@pytest.mark.timeout(60)
def test_a_pack_whose_every_image_is_skipped_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "src" / "A").mkdir(parents=True)
    (tmp_path / "src" / "A" / "x.jpg").write_bytes(b"not an image")
    result = imgpipe("pack", tmp_path / "src", tmp_path / "dst")
    assert result.returncode == 1
    assert "imgpipe: error: every source image was skipped (first: train: A/x.jpg: not an image); nothing to pack" in result.stderr
    assert "Traceback" not in result.stderr and not list((tmp_path / "dst").glob("*.rec"))


def test_given_files_of_another_split_are_refused(packed_dir: Path) -> None:
    with pytest.raises(
        DatasetError, match=r"val-00000-of-00001.rec: a shard of split 'val', opened as split 'train'; give only that split's files"
    ):
        open_shardset(str(packed_dir / "*.rec"))
    with pytest.raises(DatasetError, match=r"split='val'"):
        open_shardset(packed_dir / "val-00000-of-00001.rec")
    assert len(open_shardset(packed_dir / "val-00000-of-00001.rec", "val")) == 12
    assert len(open_shardset(str(packed_dir / "train-*.rec"))) == 48
