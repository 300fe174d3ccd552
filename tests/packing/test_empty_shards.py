"""No empty shard is ever published: shards whose every item was skipped are left out and the rest
renumbered; shard counts above the image count are cut with a warning; verify flags an empty shard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from imgpipe.errors import DatasetError
from imgpipe.format.manifest import load_manifest
from imgpipe.format.shardset import open_shardset
from imgpipe.format.verify import verify
from imgpipe.loaders.dali_index import write_dali_index


def imgpipe(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imgpipe", *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def middle_class_broken(tmp_path: Path) -> Path:
    """Classes A, B, C with two images each; B's are not images, so with --no-shuffle --shards 3 shard 1 is all skips."""
    src = tmp_path / "src"
    for label, name in enumerate("ABC"):
        (src / name).mkdir(parents=True)
        for k in range(2):
            path = src / name / f"{k}.jpg"
            if name == "B":
                path.write_bytes(b"not an image")
            else:
                Image.new("RGB", (24, 16), (80 * label, 40 * k, 0)).save(path)
    return src


@pytest.mark.timeout(120)
def test_a_shard_of_only_skipped_images_is_left_out_and_the_rest_renumbered(middle_class_broken: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    packed = imgpipe("pack", middle_class_broken, dst, "--no-shuffle", "--shards", "3", "--workers", "2")
    assert packed.returncode == 0, packed.stderr
    assert (
        "split train: 1 of 3 planned shard(s) held only skipped images and are left out; the other 2 are numbered -of-00002"
        in packed.stderr
    )
    names = sorted(p.name for p in dst.iterdir() if p.suffix in (".rec", ".idx"))
    assert names == [f"train-0000{k}-of-00002.{ext}" for k in range(2) for ext in ("idx", "rec")]
    assert all(p.stat().st_size > 0 for p in dst.glob("*.rec"))
    assert [s.name for s in load_manifest(dst).splits["train"].shards] == ["train-00000-of-00002.rec", "train-00001-of-00002.rec"]
    verified = imgpipe("verify", dst, "--decode", "--workers", "2")
    assert verified.returncode == 0, verified.stdout

    def state() -> dict[str, tuple[bytes, int]]:  # the shards keep their inodes' mtimes; the sidecars are rewritten, same bytes
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns if p.suffix in (".rec", ".idx") else 0) for p in dst.iterdir() if p.is_file()}

    before = state()
    again = imgpipe("pack", middle_class_broken, dst, "--no-shuffle", "--shards", "3", "--workers", "2")
    assert again.returncode == 0, again.stderr
    assert "shards: 0 written, 3 already done" in again.stdout
    assert state() == before
    shards = open_shardset(dst)
    assert len(shards) == 4 and shards.labels.tolist() == [0, 0, 2, 2]


@pytest.mark.timeout(120)
def test_the_renumbered_pack_is_read_by_dali(middle_class_broken: Path, tmp_path: Path) -> None:
    from imgpipe.loaders.dali import dali_available, make_dali_loader

    if not dali_available():
        pytest.skip("nvidia.dali is not importable")
    from imgpipe.packing.packer import pack

    dst = tmp_path / "dst"
    pack(middle_class_broken, dst, shuffle=False, shards=3, workers=1, progress=False)
    loader = make_dali_loader(dst, "train", batch_size=2, train=False, image_size=16, workers=1)
    labels = sorted(int(label) for _, batch_labels in loader for label in batch_labels)
    assert labels == [0, 0, 2, 2]


@pytest.mark.timeout(60)
def test_more_shards_than_images_is_cut_with_a_warning(middle_class_broken: Path, tmp_path: Path) -> None:
    (middle_class_broken / "B" / "0.jpg").unlink()
    (middle_class_broken / "B" / "1.jpg").unlink()
    packed = imgpipe("pack", middle_class_broken, tmp_path / "dst", "--shards", "1000", "--workers", "1")
    assert packed.returncode == 0, packed.stderr
    assert "split train: --shards 1000 but only 4 image(s): writing 4 shard(s) of one image" in packed.stderr
    assert len(list((tmp_path / "dst").glob("train-*-of-00004.rec"))) == 4


def test_verify_flags_an_empty_shard(tmp_path: Path) -> None:
    for ext in ("rec", "idx"):
        (tmp_path / f"train-00000-of-00001.{ext}").write_bytes(b"")
    report = verify(tmp_path, workers=1, progress=False)
    assert [str(p) for p in report.problems] == [
        "train-00000-of-00001.rec: empty shard: no records (DALI cannot map an empty file); repack, or remove it and its .idx"
    ]


def test_an_empty_bare_shard_is_one_line_for_dali(packed_dir: Path, tmp_path: Path) -> None:
    import shutil

    for ext in ("rec", "idx"):
        shutil.copy(packed_dir / f"train-00000-of-00002.{ext}", tmp_path / f"train-00000-of-00002.{ext}")
        (tmp_path / f"train-00001-of-00002.{ext}").write_bytes(b"")  # the second shard empty
    shards = open_shardset(tmp_path)
    assert len(shards) == 24  # the torch loader reads around it
    with pytest.raises(DatasetError, match=r"train-00001-of-00002.rec: empty shard \(no records\): DALI cannot map an empty file"):
        write_dali_index(shards)
