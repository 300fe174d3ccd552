"""``imgpipe stage`` with a bucket at either end, as a user runs it: real subprocesses, a real S3-API server
(moto), a proxy that slows it or adds faults; kill -9 and resume, two stagers of one folder, a damaged shard."""

from __future__ import annotations

import filecmp
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from remote_env import BUCKET
from s3_server import FaultProxy, S3Server

sys.path.insert(0, str(Path(__file__).parents[1]))
from _cli import assert_one_line_error  # noqa: E402

from imgpipe.errors import DatasetError  # noqa: E402
from imgpipe.format.shardset import open_shardset  # noqa: E402

STAGE_JOURNAL = ".imgpipe-stage"


def imgpipe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m imgpipe ARGS`` with this test's environment (its AWS variables)."""
    return subprocess.run(
        [sys.executable, "-m", "imgpipe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def start_stage(src: str, dst: Path, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "imgpipe", "stage", src, str(dst), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file())


def assert_same_files(a: Path, b: Path) -> None:
    assert files(a) == files(b)
    _, mismatch, errors = filecmp.cmpfiles(a, b, files(a), shallow=False)
    assert mismatch == [] and errors == []


def journaled(dst: Path) -> int:
    journal = dst / STAGE_JOURNAL
    return sum(1 for p in journal.iterdir() if p.name.endswith(".done")) if journal.is_dir() else 0


def wait_for(condition: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_stage_copies_between_a_folder_and_a_bucket_in_all_directions(
    s3_env: S3Server, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    up = f"s3://{BUCKET}/staged-up"
    done = imgpipe("stage", str(packed_dir), up)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{up}: staged from {packed_dir}: {len([p for p in packed_dir.iterdir() if p.is_file()]) - 1} files")
    listed = s3_env.client().list_objects_v2(Bucket=BUCKET, Prefix="staged-up/")["Contents"]
    assert sorted(o["Key"].split("/", 1)[1] for o in listed) == files(packed_dir)  # no journal left behind
    for name in files(packed_dir):
        assert s3_env.get(BUCKET, f"staged-up/{name}") == (packed_dir / name).read_bytes()
    assert imgpipe("verify", up, "--workers", "1").returncode == 0

    down = tmp_path / "node" / "imagenet"
    done = imgpipe("stage", up, str(down))
    assert done.returncode == 0, done.stderr
    assert_same_files(packed_dir, down)

    across = f"s3://{BUCKET}/staged-across"
    done = imgpipe("stage", up, across)
    assert done.returncode == 0, done.stderr
    for name in files(packed_dir):
        assert s3_env.get(BUCKET, f"staged-across/{name}") == (packed_dir / name).read_bytes()
    again = imgpipe("stage", str(packed_dir), up)
    assert again.returncode == 0 and again.stdout.strip().endswith("already there, nothing copied")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["slowdown", "truncate", "reset", "corrupt"])
def test_stage_from_the_bucket_through_faults_is_byte_identical(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path, fault: str
) -> None:
    """A fault on every second shard request (a flipped byte: twice, so that a shard is copied again) is survived."""
    fault_proxy.inject(fault, every=2, limit=2 if fault == "corrupt" else None)
    done = imgpipe("stage", remote_packed, str(tmp_path / "local"))
    assert done.returncode == 0, done.stderr
    assert fault_proxy.counts.faults[fault] >= 1
    assert_same_files(packed_dir, tmp_path / "local")


@pytest.mark.timeout(180)
def test_a_flipped_byte_in_a_remote_shard_is_named_and_nothing_is_committed(s3_env: S3Server, packed_dir: Path, tmp_path: Path) -> None:
    url = s3_env.upload(packed_dir, BUCKET, "damaged")
    shard = open_shardset(packed_dir).rec_names[1]
    data = bytearray((packed_dir / shard).read_bytes())
    data[len(data) // 2] ^= 0x01
    s3_env.put(BUCKET, f"damaged/{shard}", bytes(data))
    dst = tmp_path / "local"
    assert_one_line_error(
        imgpipe("stage", url, str(dst)), f"{url}/{shard}: sha256 differs from the manifest, twice alike", f"run 'imgpipe verify {url}'"
    )
    assert not (dst / "manifest.json").exists()
    with pytest.raises(DatasetError, match="incomplete copy"):
        open_shardset(dst)
    verified = imgpipe("verify", url, "--workers", "1")
    assert verified.returncode == 1 and f"{shard}: sha256 differs from the manifest" in verified.stdout


@pytest.mark.timeout(240)
def test_a_stage_killed_with_sigkill_resumes_to_a_byte_identical_copy(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    fault_proxy.latency_s = 0.3  # one file at a time, slowly: the kill lands mid-copy
    dst = tmp_path / "local"
    first = start_stage(remote_packed, dst, "--jobs", "1")
    wait_for(lambda: journaled(dst) >= 3)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert not (dst / "manifest.json").exists()
    kept = journaled(dst)
    assert 3 <= kept < 12
    fault_proxy.latency_s = 0.0
    shard_gets = fault_proxy.counts.matching_gets
    done = imgpipe("stage", remote_packed, str(dst))
    assert done.returncode == 0, done.stderr
    assert "kept from an earlier run" in done.stdout
    found = re.search(r"\((\d+) file\(s\) of it found in place", done.stdout)
    assert found is None or int(found[1]) <= 1, (
        done.stdout
    )  # journaled files are trusted, not hashed again (one may have been renamed just before the kill)
    assert_same_files(packed_dir, dst)
    resumed_shard_gets = fault_proxy.counts.matching_gets - shard_gets
    assert resumed_shard_gets < len(open_shardset(packed_dir).rec_names) + len(
        open_shardset(packed_dir, "val").rec_names
    )  # journaled shards were not fetched again
    assert list((dst / STAGE_JOURNAL).iterdir()) == [dst / STAGE_JOURNAL / "lock"]


@pytest.mark.timeout(240)
def test_two_stagers_of_one_folder_end_with_one_copy(fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path) -> None:
    fault_proxy.latency_s = 0.1
    dst = tmp_path / "local"
    stagers = [start_stage(remote_packed, dst, "--jobs", "2") for _ in range(2)]
    outs = [stager.communicate(timeout=200) for stager in stagers]
    assert [stager.returncode for stager in stagers] == [0, 0], [err for _, err in outs]
    waited = [out.strip().endswith("copied by another process; waited for it") for out, _ in outs]
    assert sorted(waited) == [False, True], outs
    assert fault_proxy.counts.matching_gets == 3  # each shard fetched once (one range each): one copy was made
    assert_same_files(packed_dir, dst)


@pytest.mark.timeout(240)
def test_a_killed_stager_s_lock_is_taken_over_by_the_one_waiting(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    fault_proxy.latency_s = 0.3
    dst = tmp_path / "local"
    holder = start_stage(remote_packed, dst, "--jobs", "1")
    wait_for(lambda: journaled(dst) >= 2)
    waiter = start_stage(remote_packed, dst, "--jobs", "4")
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(waiter.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    wait_for(lambda: any("another imgpipe stage (pid" in line for line in said) or waiter.poll() is not None)
    assert waiter.poll() is None, "".join(said)  # it found the lock taken and waits
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    fault_proxy.latency_s = 0.0
    assert waiter.wait(timeout=200) == 0, "".join(said)
    reader.join(timeout=30)
    assert "kept from an earlier run" in waiter.stdout.read()  # type: ignore[union-attr]
    assert_same_files(packed_dir, dst)
