"""``imgpipe stage`` between local folders (a shared mount stands for SRC), as a user runs it: real
subprocesses, real files, real full and read-only file systems; and the journal's names."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _cli import assert_one_line_error  # noqa: E402
from _fs import tmpfs  # noqa: E402

from imgpipe.errors import DatasetError  # noqa: E402
from imgpipe.format.shardset import open_shardset  # noqa: E402
from imgpipe.staging.target import entry_name, parse_entry  # noqa: E402


def imgpipe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "imgpipe", *args], capture_output=True, text=True, timeout=timeout, env=env)


def packed_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file())


def listed_files(folder: Path) -> int:
    """How many files a stage of the packed ``folder`` copies: all but its manifest."""
    return len(packed_files(folder)) - 1


def assert_same_files(a: Path, b: Path) -> None:
    assert packed_files(a) == packed_files(b)
    match, mismatch, errors = filecmp.cmpfiles(a, b, packed_files(a), shallow=False)
    assert mismatch == [] and errors == []


def flip_a_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.timeout(120)
def test_a_folder_is_staged_byte_identical_and_a_rerun_copies_nothing(packed_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "node" / "imagenet"
    done = imgpipe("stage", str(packed_dir), str(dst))
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.startswith(f"{dst}: staged from {packed_dir}: {listed_files(packed_dir)} files, ")
        and "each checked against its sha256" in done.stdout
    )
    assert_same_files(packed_dir, dst)
    assert imgpipe("verify", str(dst), "--workers", "1").returncode == 0
    again = imgpipe("stage", str(packed_dir), str(dst))
    assert again.returncode == 0 and again.stdout.strip().endswith("already there, nothing copied")
    assert [p.name for p in (dst / ".imgpipe-stage").iterdir()] == ["lock"]  # the journal is gone with the commit


@pytest.mark.timeout(120)
def test_a_file_changed_at_the_source_is_named_and_the_copy_stays_incomplete(packed_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "mount"
    shutil.copytree(packed_dir, src)
    shard = open_shardset(src).rec_names[1]
    flip_a_byte(src / shard, 1000)
    dst = tmp_path / "local"
    assert_one_line_error(
        imgpipe("stage", str(src), str(dst)), f"{src / shard}: sha256 differs from the manifest, twice alike", f"run 'imgpipe verify {src}'"
    )
    assert not (dst / "manifest.json").exists() and not (dst / shard).exists()
    with pytest.raises(
        DatasetError, match=r"incomplete copy: \d+ file\(s\) staged and checked, no manifest.json; rerun the same 'imgpipe stage"
    ):
        open_shardset(dst)
    verified = imgpipe("verify", str(dst), "--workers", "1")
    assert verified.returncode == 1 and "incomplete copy" in verified.stdout


@pytest.mark.timeout(120)
def test_a_shard_of_the_wrong_size_or_missing_at_the_source_is_one_line_before_any_copy(packed_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "mount"
    shutil.copytree(packed_dir, src)
    shard = open_shardset(src).rec_names[0]
    with open(src / shard, "ab") as f:
        f.write(b"x")
    dst = tmp_path / "local"
    assert_one_line_error(imgpipe("stage", str(src), str(dst)), f"{src / shard}: ", "bytes, the manifest says")
    assert not any(p.suffix == ".rec" for p in dst.iterdir())
    (src / shard).unlink()
    assert_one_line_error(imgpipe("stage", str(src), str(dst)), f"{src / shard}: missing, though the manifest lists it")


@pytest.mark.timeout(120)
def test_a_missing_or_unpacked_src_is_one_line(packed_dir: Path, tmp_path: Path) -> None:
    assert_one_line_error(imgpipe("stage", str(tmp_path / "nowhere"), str(tmp_path / "dst")), f"{tmp_path / 'nowhere'}: no such folder")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(
        imgpipe("stage", str(tmp_path / "empty"), str(tmp_path / "dst")), "no manifest; is", "a folder made by 'imgpipe pack'?"
    )
    assert_one_line_error(imgpipe("stage", str(packed_dir), str(packed_dir)), "SRC and DST are the same folder")


@pytest.mark.timeout(120)
def test_a_dst_inside_src_or_at_an_unsupported_url_is_one_line_and_nothing_is_copied(packed_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(packed_dir, src)
    before = sorted(p.name for p in src.iterdir())
    assert_one_line_error(imgpipe("stage", str(src), str(src / "sub" / "copy")), "DST is inside SRC", "give a DST outside it")
    assert sorted(p.name for p in src.iterdir()) == before
    assert_one_line_error(imgpipe("stage", str(src), "s4://bucket/imagenet"), "s4://bucket/imagenet: unsupported URL scheme 's4'")


@pytest.mark.timeout(120)
def test_too_little_space_is_one_line_before_anything_is_copied(packed_dir: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "256k") as small:  # the pack is about 400 KB
        done = imgpipe("stage", str(packed_dir), str(small / "imagenet"))
        assert_one_line_error(done, f"{small / 'imagenet'}: the copy needs about", "free some space or choose another DST")
        assert packed_files(small / "imagenet") == []


@pytest.mark.timeout(120)
def test_an_unwritable_dst_is_one_line(packed_dir: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as read_only:
        assert_one_line_error(
            imgpipe("stage", str(packed_dir), str(read_only / "imagenet")), f"{read_only / 'imagenet'}: cannot make the folder", "read-only"
        )
    (tmp_path / "file").write_text("x")
    assert_one_line_error(imgpipe("stage", str(packed_dir), str(tmp_path / "file")), f"{tmp_path / 'file'}: is a file, not a folder")


@pytest.mark.timeout(180)
def test_a_dst_holding_another_dataset_is_refused_then_replaced_with_overwrite(packed_dir: Path, synth_tree: Path, tmp_path: Path) -> None:
    from imgpipe.packing.packer import pack

    other = tmp_path / "other"
    pack(synth_tree, other, shards="train=3,val=1", workers=1, progress=False)  # other shard names, another manifest
    dst = tmp_path / "local"
    assert imgpipe("stage", str(other), str(dst)).returncode == 0
    assert_one_line_error(imgpipe("stage", str(packed_dir), str(dst)), f"{dst}: holds another dataset", "pass --overwrite to replace it")
    assert (dst / "manifest.json").read_bytes() == (other / "manifest.json").read_bytes()  # untouched
    done = imgpipe("stage", str(packed_dir), str(dst), "--overwrite")
    assert done.returncode == 0, done.stderr
    assert_same_files(packed_dir, dst)  # the other pack's shards are gone


@pytest.mark.timeout(120)
def test_files_in_place_but_not_journaled_are_hashed_not_copied(packed_dir: Path, tmp_path: Path) -> None:
    """A stage killed between a rename and its journal entry, or a folder copied by hand: the rerun hashes what is
    there, keeps what is right and copies the rest."""
    dst = tmp_path / "local"
    dst.mkdir()
    for name in packed_files(packed_dir):
        if name != "manifest.json":
            shutil.copyfile(packed_dir / name, dst / name)
    shard = open_shardset(packed_dir).rec_names[0]
    flip_a_byte(dst / shard, 500)
    done = imgpipe("stage", str(packed_dir), str(dst))
    assert done.returncode == 0, done.stderr
    assert_same_files(packed_dir, dst)
    copied = (packed_dir / shard).stat().st_size
    assert f"{copied / 1e6:.1f} MB copied" in done.stdout or f"{copied / 1e3:.1f} KB copied" in done.stdout, done.stdout
    assert f"({listed_files(packed_dir) - 1} file(s) of it found in place and checked)" in done.stdout


def test_a_journal_entry_names_the_file_its_size_and_hash() -> None:
    sha = "ab" * 32
    assert parse_entry(entry_name("train-00000-of-00002.rec", 1234, sha)) == ("train-00000-of-00002.rec", 1234, sha)
    assert parse_entry(entry_name("val.sources.txt", 0, sha)) == ("val.sources.txt", 0, sha)
    assert parse_entry("lock") is None and parse_entry("x.part") is None and parse_entry("a.notanumber.ff.done") is None


@pytest.mark.timeout(120)
def test_the_stage_report_counts_what_was_copied(packed_dir: Path, tmp_path: Path) -> None:
    from imgpipe.staging.stager import stage

    report = stage(packed_dir, tmp_path / "a")
    total = sum(p.stat().st_size for p in packed_dir.iterdir() if p.is_file() and p.name != "manifest.json")
    assert (report.files, report.total_bytes, report.copied_bytes, report.waited) == (listed_files(packed_dir), total, total, False)
    again = stage(packed_dir, tmp_path / "a")
    assert (again.total_bytes, again.copied_bytes) == (total, 0)
    assert json.loads((tmp_path / "a" / "manifest.json").read_text()) == json.loads((packed_dir / "manifest.json").read_text())


@pytest.mark.timeout(120)
def test_a_file_whose_sha256_the_manifest_lacks_is_checked_by_size_and_parse_and_says_so(packed_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "mount"
    shutil.copytree(packed_dir, src)
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["splits"]["train"]["sources_sha256"] = ""  # a manifest edited by hand
    (src / "manifest.json").write_text(json.dumps(manifest))
    done = imgpipe("stage", str(src), str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    assert f"{src / 'train.sources.txt'}: the manifest holds no sha256 for it: checked by its size and by parsing it only" in done.stderr
    assert_same_files(src, tmp_path / "a")
    with open(src / "train.sources.txt", "ab") as f:
        f.write(b"train/one/line/too/many.JPEG\n")
    assert_one_line_error(
        imgpipe("stage", str(src), str(tmp_path / "b")), f"{src / 'train.sources.txt'}: ", "lines, the manifest counts 48 records"
    )
