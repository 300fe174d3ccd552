"""`imgpipe pack`, `imgpipe verify` and `imgpipe info` as a user runs them: real subprocesses."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _cli import assert_one_line_error
from _fs import as_plain_user, fill, tmpfs

from imgpipe.format.manifest import load_manifest
from imgpipe.format.recordio import FRAME_HEADER, IR_SIZE, read_index
from imgpipe.synth.tree import make_synthetic


def imgpipe(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imgpipe", *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(120)
def test_pack_verify_info_round_trip(synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    packed = imgpipe("pack", synth_tree, dst, "--shards", "train=2,val=1", "--workers", "2", "--seed", "7")
    assert packed.returncode == 0, packed.stderr
    assert f"packed 60 records (train 48, val 12) into {dst}" in packed.stdout
    manifest = load_manifest(dst)
    assert manifest.options["seed"] == 7 and manifest.options["shards"] == {"train": 2, "val": 1}

    verified = imgpipe("verify", dst, "--decode", "--workers", "2")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    megabytes = manifest.splits["train"].bytes / 1e6 + manifest.splits["val"].bytes / 1e6
    assert verified.stdout.strip() == f"{dst}: OK: checked and decoded 60 records in 3 shard(s), {megabytes:,.1f} MB"

    info = imgpipe("info", dst)
    assert info.returncode == 0, info.stderr
    assert "train            48 records" in info.stdout and "val              12 records" in info.stdout
    assert f"classes: 4: {', '.join(manifest.classes)}" in info.stdout
    assert "seed=7" in info.stdout and "skipped: 0" in info.stdout

    again = imgpipe("pack", synth_tree, dst, "--shards", "train=2,val=1", "--seed", "8")
    assert_one_line_error(again, "different options (seed 7 -> 8)", "--overwrite")


@pytest.mark.timeout(120)
def test_verify_exits_non_zero_and_locates_a_corrupt_record(packed_dir: Path, tmp_path: Path) -> None:
    dst = Path(shutil.copytree(packed_dir, tmp_path / "copy"))
    shard = load_manifest(dst).splits["train"].shards[1]
    first = load_manifest(dst).splits["train"].shards[0].records
    _, offsets = read_index(dst / shard.index)
    data = bytearray((dst / shard.name).read_bytes())
    data[int(offsets[4]) + FRAME_HEADER.size + IR_SIZE + 50] ^= 1
    (dst / shard.name).write_bytes(bytes(data))
    result = imgpipe("verify", dst)
    assert result.returncode == 1
    assert f"{shard.name}: record {first + 4} (offset {offsets[4]}, source train/" in result.stdout
    assert "checksum mismatch" in result.stdout
    assert f"{dst}: 2 problem(s)" in result.stdout


@pytest.mark.timeout(120)
def test_strict_exit_code_and_skip_summary(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_synthetic(src, classes=2, per_class=3, val_per_class=1, quirks=True, min_side=32, max_side=64, progress=False)
    lenient = imgpipe("pack", src, tmp_path / "a", "--workers", "1")
    assert lenient.returncode == 0, lenient.stderr
    assert "skipped 3 file(s):" in lenient.stdout and "5 repaired" in lenient.stdout
    strict = imgpipe("pack", src, tmp_path / "b", "--workers", "1", "--strict")
    assert_one_line_error(strict, "--strict: 3 source file(s) were skipped")
    info = imgpipe("info", tmp_path / "a")
    assert "skipped: 3" in info.stdout


@pytest.mark.timeout(120)
def test_user_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    assert_one_line_error(imgpipe("pack", tmp_path / "missing", tmp_path / "out"), "no such folder", "missing")
    (tmp_path / "noimages" / "n01").mkdir(parents=True)
    (tmp_path / "noimages" / "n01" / "readme.txt").write_text("hi")
    assert_one_line_error(imgpipe("pack", tmp_path / "noimages", tmp_path / "out"), "no images found")
    assert_one_line_error(imgpipe("pack", tmp_path / "noimages", tmp_path / "out", "--shard-size", "lots"), "--shard-size 'lots'")
    assert_one_line_error(imgpipe("verify", tmp_path / "nowhere"), "not found")
    assert_one_line_error(imgpipe("info", tmp_path / "noimages"), "no manifest")


@pytest.mark.timeout(60)
def test_a_file_as_dst_and_an_empty_splits_list_are_one_line_errors(synth_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    assert_one_line_error(imgpipe("pack", synth_tree, tmp_path / "afile"), "DST", "afile is a file, not a folder")
    assert_one_line_error(imgpipe("pack", synth_tree, tmp_path / "out", "--splits", ","), "--splits ','", "names no split")
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
def test_info_on_a_rec_file_is_a_one_line_error(packed_dir: Path) -> None:
    rec = packed_dir / load_manifest(packed_dir).splits["val"].shards[0].name
    assert_one_line_error(imgpipe("info", rec), "no manifest", rec.name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda m: m["splits"]["train"]["shards"][0].update(records="x"), "ShardInfo records is 'x', not int"),
        (lambda m: m["splits"]["train"]["shards"][0].update(bytes=None), "ShardInfo bytes is null, not int"),
        (lambda m: m["splits"]["train"]["shards"][0].update(records=8.5), "ShardInfo records is 8.5, not int"),
        (lambda m: m["splits"]["train"].update(labels=7), "SplitInfo labels is 7, not str"),
        (lambda m: m.update(options=["abc"]), "Manifest options is ['abc'], not dict"),
        (lambda m: m.update(classes=[1, 2]), "Manifest classes[0] is 1, not str"),
    ],
)
def test_a_manifest_field_of_the_wrong_type_is_one_line_naming_it(packed_dir: Path, tmp_path: Path, edit: Any, named: str) -> None:
    data = tmp_path / "edited"
    shutil.copytree(packed_dir, data)
    manifest = json.loads((data / "manifest.json").read_text())
    edit(manifest)
    (data / "manifest.json").write_text(json.dumps(manifest))
    for command in ("verify", "info"):
        assert_one_line_error(imgpipe(command, data), "manifest.json: malformed manifest", named)


@pytest.mark.timeout(60)
def test_negative_list_limits_are_refused(packed_dir: Path) -> None:
    result = imgpipe("verify", packed_dir, "--max-problems", "-1", "--no-progress")
    assert result.returncode == 2 and "Traceback" not in result.stderr and "'--max-problems': -1" in result.stderr
    assert "more problem" not in result.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_an_out_of_range_seed_is_one_line(synth_tree: Path, tmp_path: Path, seed: str) -> None:
    assert_one_line_error(imgpipe("pack", synth_tree, tmp_path / "out", "--seed", seed), f"--seed {seed}", "from 0 to 4294967295")
    assert not list((tmp_path / "out").glob("*.rec"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_pack_says_a_rerun_resumes_and_it_does(tmp_path: Path, signum: int) -> None:
    """Stopped after its first shard (SIGTERM: a preemption; SIGINT to the group: Ctrl-C): one line, 143/130, a rerun finishes."""
    src, dst = tmp_path / "src", tmp_path / "out"
    make_synthetic(src, classes=4, per_class=40, val_per_class=0, min_side=300, max_side=400, progress=False)
    cmd = [sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), "--workers", "1", "--shards", "40", "--resize", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list((dst / ".imgpipe-pack").glob("train-*.json")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signum) if signum == signal.SIGINT else proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"imgpipe: stopped by {signal.Signals(signum).name}: rerun the same command to resume; the records written in {dst} are kept"
    )
    assert list(dst.glob(".*.tmp")) == []
    rerun = imgpipe(*cmd[3:])
    assert rerun.returncode == 0, rerun.stderr
    assert re.search(r"shards: \d+ written, [1-9]\d* already done, 40 in the plan", rerun.stdout), rerun.stdout


def imgpipe_as_user(*args: object) -> subprocess.CompletedProcess[str]:
    """``imgpipe`` as a plain user meets file permissions, root included (tests/_fs.py)."""
    return subprocess.run(
        [sys.executable, "-m", "imgpipe", *map(str, args)], capture_output=True, text=True, timeout=120, preexec_fn=as_plain_user
    )


@pytest.mark.timeout(120)
def test_an_unreadable_class_folder_or_val_csv_is_one_line_naming_it(synth_tree: Path, tmp_path: Path) -> None:
    src = Path(shutil.copytree(synth_tree, tmp_path / "src"))
    csv, folder = src / "LOC_val_solution.csv", sorted((src / "train").iterdir())[0]
    for path in (csv, folder):
        path.chmod(0)
        try:
            result = imgpipe_as_user("pack", src, tmp_path / "out", "--workers", "1")
        finally:
            path.chmod(0o755)
        assert_one_line_error(result, f"SRC {path}: cannot read it: Permission denied (EACCES)", "read access")


@pytest.mark.timeout(120)
def test_a_read_only_dst_is_named_as_such_and_a_forbidden_one_as_permission_denied(synth_tree: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        for dst in (ro, ro / "sub"):
            result = imgpipe("pack", synth_tree, dst)
            assert_one_line_error(result, f"DST {dst}: cannot ", "Read-only file system (EROFS)", "remount it read-write")
            assert "Permission denied" not in result.stderr
    (tmp_path / "locked").mkdir(mode=0o555)
    result = imgpipe_as_user("pack", synth_tree, tmp_path / "locked")
    assert_one_line_error(result, f"DST {tmp_path / 'locked'}: cannot write there: Permission denied (EACCES)", "write access")


@pytest.mark.timeout(180)
def test_a_disk_that_fills_up_mid_pack_names_dst_and_the_rerun_resumes(tmp_path: Path) -> None:
    """The free-space check passes; then another writer fills the disk after the first shard (a real ENOSPC on a tmpfs)."""
    src = tmp_path / "src"
    make_synthetic(src, classes=4, per_class=40, val_per_class=0, min_side=300, max_side=400, progress=False)
    size_mb = sum(p.stat().st_size for p in src.rglob("*") if p.is_file()) // 2**20 + 2
    with tmpfs(tmp_path / "disk", f"{size_mb}m") as disk:
        dst = disk / "out"
        # --no-shuffle: shards hold runs of files in read order, so they are finished one after another, not all at the end
        cmd = [
            sys.executable,
            "-m",
            "imgpipe",
            "pack",
            str(src),
            str(dst),
            "--workers",
            "1",
            "--shards",
            "40",
            "--resize",
            "64",
            "--no-shuffle",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not list((dst / ".imgpipe-pack").glob("train-*.json")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        filler = fill(disk)
        stdout, stderr = proc.communicate(timeout=60)
        assert_one_line_error(
            subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr),
            f"DST {dst}: writing shard",
            "No space left on device (ENOSPC)",
            "free space there",
            "rerun the same command to resume",
        )
        assert list(dst.glob(".*.tmp")) == []
        filler.unlink()
        rerun = imgpipe(*cmd[3:])
        assert rerun.returncode == 0, rerun.stderr
        assert re.search(r"shards: \d+ written, [1-9]\d* already done, 40 in the plan", rerun.stdout), rerun.stdout


@pytest.mark.timeout(120)
def test_an_unreadable_shard_or_index_is_a_finding_not_a_crash(packed_dir: Path, tmp_path: Path) -> None:
    dst = Path(shutil.copytree(packed_dir, tmp_path / "copy"))
    manifest = load_manifest(dst)
    rec, idx = dst / manifest.splits["train"].shards[0].name, dst / manifest.splits["val"].shards[0].index
    idx.unlink()
    idx.mkdir()  # a folder where the index should be: met by any user
    rec.chmod(0)  # met as a plain user
    result = imgpipe_as_user("verify", dst, "--workers", "2")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{rec.name}: cannot read it: Permission denied (EACCES); give the user running imgpipe read access" in result.stdout
    assert f"{idx.name}: cannot read it: Is a directory (EISDIR)" in result.stdout
    assert f"{dst}: 2 problem(s)" in result.stdout
