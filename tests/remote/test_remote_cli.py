"""The CLI on a URL, as a user runs it (real subprocesses, a real S3-API server): info, verify, bench,
train; a missing bucket, bad credentials, an unreachable endpoint or a missing obstore is one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from remote_env import BUCKET
from s3_server import S3Server, free_port

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from _cli import assert_one_line_error  # noqa: E402
from proctree import descendants, wait_gone  # noqa: E402

from imgpipe.format.shardset import open_shardset  # noqa: E402


def imgpipe(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m imgpipe ARGS`` with this test's environment (its AWS variables) plus ``env``."""
    full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-m", "imgpipe", *args], capture_output=True, text=True, timeout=timeout, env=full)


@pytest.mark.timeout(120)
def test_info_reads_the_manifest_at_a_url(s3_env: S3Server, remote_packed: str) -> None:
    done = imgpipe("info", remote_packed)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{remote_packed}  (imgpipe-recordio v1") and "train" in done.stdout and "48 records" in done.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", ["1", "2"])
def test_verify_a_url_passes_then_names_the_shard_with_a_flipped_byte(s3_env: S3Server, packed_dir: Path, workers: str) -> None:
    url = s3_env.upload(packed_dir, BUCKET, f"verify-{workers}")
    done = imgpipe("verify", url, "--workers", workers)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip()
        == f"{url}: OK: checked 60 records in 3 shard(s), {sum(p.stat().st_size for p in packed_dir.glob('*.rec')) / 1e6:.1f} MB"
    )
    local = open_shardset(packed_dir)
    shard, start, end = local.location(30)
    name = local.rec_names[shard]
    data = bytearray((packed_dir / name).read_bytes())
    data[(start + end) // 2] ^= 0x01
    s3_env.put(BUCKET, f"verify-{workers}/{name}", bytes(data))
    s3_env.put(BUCKET, f"verify-{workers}/train-00009-of-00009.rec", b"left from another pack")
    done = imgpipe("verify", url, "--workers", workers)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert f"{name}: sha256 differs from the manifest (the file changed since packing)" in lines
    assert any(line.startswith(f"{name}: record 30 (offset {start}") and "checksum mismatch" in line for line in lines), lines
    assert any(line.startswith("train-00009-of-00009.rec: not listed in manifest.json") for line in lines), lines
    assert lines[-1].startswith(f"{url}: 3 problem(s)")


@pytest.mark.timeout(120)
def test_a_missing_bucket_is_one_line(s3_env: S3Server) -> None:
    for command in ("info", "verify"):
        assert_one_line_error(imgpipe(command, "s3://no-such-bucket/data"), "s3://no-such-bucket/data: the bucket does not exist")


@pytest.mark.timeout(120)
def test_bad_credentials_are_one_line(s3_env: S3Server, remote_packed: str) -> None:
    with s3_env.auth_required() as (key, _):
        done = imgpipe("info", remote_packed, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY="wrong")
    assert_one_line_error(done, f"{remote_packed}: access denied (SignatureDoesNotMatch)", "check the credentials")


@pytest.mark.timeout(120)
def test_an_unreachable_endpoint_is_one_line_within_the_retry_time(s3_env: S3Server) -> None:
    done = imgpipe("info", f"s3://{BUCKET}/packed", AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", IMGPIPE_REMOTE_TIMEOUT="2")
    assert_one_line_error(done, f"s3://{BUCKET}/packed/manifest.json: ", "gave up after")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("url", "why"), [("https://256.256.256.256/data", "invalid IPv4 address"), ("s3:///data", "Unable to recognise URL")]
)
def test_a_url_the_client_cannot_parse_is_one_line_at_once_not_retried(url: str, why: str) -> None:
    for command in ("info", "verify"):
        done = imgpipe(command, url, timeout=20)  # the retry time is 30 s: a retried error would time out here
        assert_one_line_error(done, f"{url}: not a URL imgpipe can read (", why)


@pytest.mark.timeout(120)
def test_ctrl_c_while_an_endpoint_is_retried_stops_every_process_without_a_traceback(s3_env: S3Server) -> None:
    with socket.create_server(("127.0.0.1", 0)) as endpoint:  # an endpoint that drops every connection it takes
        connections = []

        def drop() -> None:
            while True:
                try:
                    connection, _ = endpoint.accept()
                except OSError:  # closed: the test is over
                    return
                connection.close()
                connections.append(connection)

        threading.Thread(target=drop, daemon=True).start()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{endpoint.getsockname()[1]}"}
        run = subprocess.Popen([sys.executable, "-m", "imgpipe", "verify", f"s3://{BUCKET}/packed", "--no-progress"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while len(connections) < 2 and time.monotonic() < deadline and run.poll() is None:  # asked, then asked again: retrying
            time.sleep(0.05)
        helpers = descendants(run.pid)
        assert len(connections) >= 2 and helpers, "verify's store helper did not retry the endpoint"
        os.killpg(run.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group
        _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "imgpipe: aborted" in err
    assert not wait_gone(helpers, 10)


@pytest.mark.timeout(120)
def test_without_obstore_a_url_is_one_line_naming_the_extra(s3_env: S3Server, remote_packed: str) -> None:
    hide = "import runpy, sys; sys.modules['obstore'] = None; sys.argv[0] = 'imgpipe'; runpy.run_module('imgpipe', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", hide, "info", remote_packed], capture_output=True, text=True, timeout=60)
    assert_one_line_error(done, f"{remote_packed}: reading from a URL needs obstore: pip install 'imgpipe[remote]'")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_measures_a_url(s3_env: S3Server, remote_packed: str, tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    done = imgpipe(
        "bench",
        remote_packed,
        "--gpus",
        "0",
        "--nproc",
        "1",
        "--workers",
        "1",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--batch-size",
        "4",
        "--image-size",
        "32",
        "--json",
        str(report),
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["data"]["disk"]["fstype"] == "s3" and result["data"]["disk"]["network"] is True
    assert f"network s3 at {remote_packed}" in done.stdout
    assert_one_line_error(imgpipe("bench", remote_packed, "--gpus", "0", "--cold"), "--cold evicts DATA from this machine's page cache")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_train_from_a_url_sees_the_batches_of_the_local_folder(
    s3_env: S3Server, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    def train(data: str, run: str) -> list[float]:
        done = imgpipe(
            "train",
            "--set",
            f"data.path={data}",
            "--set",
            "data.image_size=32",
            "--set",
            "data.workers=1",
            "--set",
            "model.name=resnet18",
            "--set",
            "train.batch_size=8",
            "--set",
            "train.max_steps=3",
            "--set",
            "train.seed=0",
            "--set",
            "train.log_every=1",
            "--set",
            f"output.dir={tmp_path / run}",
            "--set",
            "output.tensorboard=false",
            "--set",
            "output.checkpoint_every_epochs=0",
            timeout=380,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "step"]

    remote, local = train(remote_packed, "remote"), train(str(packed_dir), "local")
    assert len(remote) == 3 and remote == pytest.approx(local, rel=1e-4)
