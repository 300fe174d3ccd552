"""A packed folder read from a real S3-API server (and over plain HTTP) is the local folder: index,
labels, bytes; the reads are batched, checked, retried, and fail in one line naming where."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from remote_env import BUCKET, aws_env
from s3_server import FAULTS, FaultProxy, S3Server, free_port

from imgpipe.errors import ConfigError, DatasetError, RemoteError
from imgpipe.format.shardset import open_shardset
from tests._packs import without_index_sidecar

pytestmark = pytest.mark.timeout(120)


def _same_records(local, remote) -> None:
    assert len(remote) == len(local) and remote.classes == local.classes
    assert np.array_equal(remote.labels, local.labels) and np.array_equal(remote.keys, local.keys)
    records = remote.fetch(np.arange(len(remote)))
    for i in range(len(local)):
        assert records.read_view(i)[1] == local.read(i)[1], i


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_bucket_holds_the_same_records_as_the_folder(s3_env: S3Server, remote_packed: str, packed_dir: Path, split: str) -> None:
    local, remote = open_shardset(packed_dir, split), open_shardset(remote_packed, split)
    _same_records(local, remote)
    assert remote.read(3)[1] == local.read(3)[1] and remote.source(3) == local.source(3)
    assert remote.describe(3).startswith(f"{remote_packed}/{split}-00000-of-")
    clone = pickle.loads(pickle.dumps(remote))  # as a spawned loader worker receives it
    assert clone.read(len(clone) - 1)[1] == local.read(len(local) - 1)[1]


def test_a_folder_served_over_http_reads_the_same(s3_env: S3Server, remote_packed: str, packed_dir: Path) -> None:
    """moto serves public objects at http://host:port/bucket/key, with Range: a plain HTTP folder."""
    url = f"{s3_env.endpoint}/{BUCKET}/packed"
    _same_records(open_shardset(packed_dir), open_shardset(url))


def test_the_index_is_fetched_once_and_a_batch_in_one_request_per_shard(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path
) -> None:
    remote = open_shardset(remote_packed)
    assert fault_proxy.counts.gets == 4  # manifest, then the index, labels and crc32 sidecars: 4 for any number of shards
    before = fault_proxy.counts.matching_gets
    neighbours = np.arange(10, 26)  # 16 neighbouring records, as block_shuffle puts them in one batch
    records = remote.fetch(neighbours)
    assert [records.read_view(k)[1] for k in range(16)] == [open_shardset(packed_dir).read(int(i))[1] for i in neighbours]
    assert fault_proxy.counts.matching_gets - before == len({remote.location(int(i))[0] for i in neighbours})


def test_a_pack_made_before_the_index_sidecar_is_read_from_its_idx_files(
    fault_proxy: FaultProxy, s3_server: S3Server, packed_dir: Path, tmp_path: Path
) -> None:
    older = Path(shutil.copytree(packed_dir, tmp_path / "older"))
    without_index_sidecar(older)
    remote = open_shardset(s3_server.upload(older, BUCKET, "older"))
    assert fault_proxy.counts.gets == 1 + len(remote.rec_names) + 2  # manifest, every .idx, labels and crc32 sidecars
    _same_records(open_shardset(packed_dir), remote)


def test_batches_named_ahead_are_requested_before_they_are_asked_for(fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path) -> None:
    """A torch loader worker names the batches queued to it (prefetch_factor - 1 of them) as ``ahead``."""
    remote, local = open_shardset(remote_packed), open_shardset(packed_dir)
    batches = [np.arange(4 * k, 4 * k + 4) for k in range(4)]  # neighbours in one shard: one request each
    before = fault_proxy.counts.matching_gets
    remote.fetch(batches[0], ahead=batches[1:])
    deadline = time.monotonic() + 30
    while fault_proxy.counts.matching_gets - before < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fault_proxy.counts.matching_gets - before == 4  # the three batches ahead, requested before anyone asked
    for batch in batches[1:]:
        records = remote.fetch(batch)
        assert [records.read_view(k)[1] for k in range(4)] == [local.read(int(i))[1] for i in batch]
    assert fault_proxy.counts.matching_gets - before == 4


@pytest.mark.parametrize("fault", FAULTS)
def test_faults_on_every_other_request_are_survived(fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, fault: str) -> None:
    remote = open_shardset(remote_packed)
    fault_proxy.inject(fault, every=2)
    _same_records(open_shardset(packed_dir), remote)
    assert fault_proxy.counts.faults[fault] > 0


def test_bytes_damaged_in_the_bucket_fail_that_record_only_in_one_line(s3_env: S3Server, packed_dir: Path, tmp_path: Path) -> None:
    local = open_shardset(packed_dir)
    shard, start, end = local.location(7)
    damaged = bytearray((packed_dir / local.rec_names[shard]).read_bytes())
    damaged[(start + end) // 2] ^= 0xFF
    url = s3_env.upload(packed_dir, BUCKET, "damaged")
    s3_env.put(BUCKET, f"damaged/{local.rec_names[shard]}", bytes(damaged))
    records = open_shardset(url).fetch([6, 7, 8])
    assert records.read_view(0)[1] == local.read(6)[1] and records.read_view(2)[1] == local.read(8)[1]
    with pytest.raises(RemoteError) as info:
        records.read_view(1)
    message = str(info.value)
    assert message.startswith(f"{url}/{local.rec_names[shard]} record 7 (id ") and "crc32 differs from the checksum sidecar" in message
    assert "stored file is damaged" in message and "\n" not in message


def test_a_record_still_failing_when_the_time_is_up_is_named(
    fault_proxy: FaultProxy, remote_packed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMGPIPE_REMOTE_TIMEOUT", "1.5")
    remote = open_shardset(remote_packed)
    fault_proxy.inject("slowdown")
    with pytest.raises(RemoteError) as info:
        remote.read(5)
    message = str(info.value)
    assert message.startswith(f"{remote_packed}/train-0000") and " record 5 (id " in message
    assert "gave up after" in message and "\n" not in message


def test_a_missing_bucket_file_or_split_is_one_line(s3_env: S3Server, remote_packed: str) -> None:
    with pytest.raises(RemoteError, match="s3://no-such-bucket/x: the bucket does not exist"):
        open_shardset("s3://no-such-bucket/x")
    with pytest.raises(DatasetError, match=f"{BUCKET}/nothing/manifest.json: no manifest"):
        open_shardset(f"s3://{BUCKET}/nothing")
    with pytest.raises(DatasetError, match="no split 'test'"):
        open_shardset(remote_packed, "test")
    with pytest.raises(DatasetError, match="unsupported URL scheme 'ftp'"):
        open_shardset("ftp://host/folder")
    with pytest.raises(DatasetError, match="give the folder's URL alone"):
        open_shardset([remote_packed, remote_packed])


def test_bad_credentials_are_refused_in_one_line(s3_env: S3Server, remote_packed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with s3_env.auth_required() as (key, secret):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        assert len(open_shardset(remote_packed)) == 48  # the server checks, and takes the right key
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(RemoteError, match=f"{remote_packed}: access denied .*check the credentials"):
            open_shardset(remote_packed)


def test_an_aws_profile_supplies_the_credentials(
    s3_env: S3Server, remote_packed: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without AWS_ACCESS_KEY_ID, the profile chain (AWS_PROFILE in a credentials file) is read as the AWS tools read it."""
    with s3_env.auth_required() as (key, secret):
        credentials = tmp_path / "credentials"
        credentials.write_text(
            f"[imgpipe]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
            f"[stale]\naws_access_key_id = {key}\naws_secret_access_key = old\n"
        )
        aws_env(monkeypatch, {"AWS_ENDPOINT_URL": s3_env.endpoint, "AWS_DEFAULT_REGION": "us-east-1", "AWS_PROFILE": "imgpipe"}, tmp_path)
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
        assert len(open_shardset(remote_packed)) == 48
        monkeypatch.setenv("AWS_PROFILE", "stale")
        with pytest.raises(RemoteError, match="access denied"):
            open_shardset(remote_packed)


def test_an_unreachable_endpoint_is_one_line_once_the_retry_time_is_up(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed}")
    monkeypatch.setenv("IMGPIPE_REMOTE_TIMEOUT", "2")
    with pytest.raises(RemoteError, match=f"s3://{BUCKET}/packed/manifest.json: .*gave up after"):
        open_shardset(f"s3://{BUCKET}/packed")


def test_a_bad_retry_time_is_a_config_error(s3_env: S3Server, remote_packed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMGPIPE_REMOTE_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="IMGPIPE_REMOTE_TIMEOUT='soon'"):
        open_shardset(remote_packed)


def test_without_obstore_a_url_names_the_extra_to_install(remote_packed: str) -> None:
    code = textwrap.dedent(f"""
        import sys
        sys.modules["obstore"] = None  # as if it were not installed
        from imgpipe.format.shardset import open_shardset
        open_shardset({remote_packed!r})
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert result.returncode != 0
    assert f"ConfigError: {remote_packed}: reading from a URL needs obstore: pip install 'imgpipe[remote]'" in result.stderr


def _uint64_sidecar(packed_dir: Path, dst: Path) -> Path:
    """``packed_dir`` with its train index sidecar stored as uint64 and record 1's offset 2**64 - 16 (-16 as int64),
    the manifest's sha256 of it updated: a sidecar the manifest vouches for, with an offset no file can hold."""
    import hashlib
    import json

    from imgpipe.format.files import _npy_bytes

    shutil.copytree(packed_dir, dst)
    array = np.load(dst / "train.index.npy").astype(np.uint64)
    array[1, 1] = 2**64 - 16
    data = _npy_bytes(array)
    (dst / "train.index.npy").write_bytes(data)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["splits"]["train"]["index_sidecar_sha256"] = hashlib.sha256(data).hexdigest()
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_an_index_sidecar_of_uint64_with_an_offset_past_any_file_is_one_line_at_once(
    fault_proxy: FaultProxy, s3_server: S3Server, packed_dir: Path, tmp_path: Path
) -> None:
    """Locally and from a bucket: one line naming the sidecar when the split is opened, nothing fetched again."""
    folder = _uint64_sidecar(packed_dir, tmp_path / "uint64")
    with pytest.raises(DatasetError, match=r"train\.index\.npy: record 1: offset 18446744073709551600 is beyond"):
        open_shardset(folder)
    url = s3_server.upload(folder, BUCKET, "uint64")
    gets = fault_proxy.counts.gets
    with pytest.raises(DatasetError, match=rf"{url}/train\.index\.npy: record 1: offset 18446744073709551600 is beyond"):
        open_shardset(url)
    assert fault_proxy.counts.gets - gets == 4  # the manifest, the index, labels and crc32 sidecars: no try again


class _Counting:
    """A store client that counts the range reads it passes on."""

    def __init__(self, client: object) -> None:
        self.client, self.calls = client, 0

    def get_ranges(self, *args: object) -> object:
        self.calls += 1
        return self.client.get_ranges(*args)  # type: ignore[attr-defined]


def test_a_range_the_store_client_refuses_is_not_tried_again(s3_env: S3Server, remote_packed: str, packed_dir: Path) -> None:
    """An error that cannot change on another try (obstore refuses a negative offset before any request) is
    the range's error at once, not retried for the retry time."""
    from imgpipe.storage.objectstore import ObjectStoreSource
    from imgpipe.storage.source import ByteRange
    from imgpipe.storage.store_client import DirectClient

    client = _Counting(DirectClient(30.0))
    source = ObjectStoreSource(remote_packed, client=client)
    name = open_shardset(packed_dir).rec_names[0]
    (bad,) = source.read_ranges([ByteRange(name, -16, 100)])
    assert isinstance(bad, RemoteError) and "offset -16" in str(bad) and "OverflowError" in str(bad) and "gave up" not in str(bad)
    assert client.calls == 1
    (good,) = source.read_ranges([ByteRange(name, 0, 100)])
    assert bytes(good) == (packed_dir / name).read_bytes()[:100]


def test_a_server_answering_500_is_named_by_its_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers every request at once with HTTP 500: the line says so, not that no answer came."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Failing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("IMGPIPE_REMOTE_TIMEOUT", "4")
    url = f"http://127.0.0.1:{server.server_address[1]}/folder"
    try:
        with pytest.raises(RemoteError) as info:
            open_shardset(url)
    finally:
        server.shutdown()
        server.server_close()
    message = str(info.value)
    assert message.startswith(f"{url}/manifest.json: the server answered HTTP 500 Internal Server Error; gave up after "), message
    assert "no answer" not in message and "\n" not in message
