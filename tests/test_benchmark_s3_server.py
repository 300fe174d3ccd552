"""benchmarks/_s3_server.py: moto's S3 server with objects in memory, a latency per request and
request counts, started as a real child process on 127.0.0.1 and stopped by each test."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3", reason="boto3 is a dev dependency (pip install 'imgpipe[dev]')")
moto_models = pytest.importorskip("moto.s3.models", reason="moto[server] is a dev dependency (pip install 'imgpipe[dev]')")

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_s3_server", ROOT / "benchmarks" / "_s3_server.py")
s3_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s3_server)

BIG = 12 << 20  # over moto's 5 MB threshold for keeping a value in a temporary file


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with s3_server.start(latency_s=0.05, lifetime_s=120) as running:
        yield running
    assert running.process.poll() is not None


def test_a_key_keeps_its_value_in_memory_and_hands_it_over_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moto_models, "tempfile", moto_models.tempfile)  # restored after the test
    s3_server.keep_values_in_memory()
    value = os.urandom(BIG)
    key = moto_models.FakeKey("k", value, account_id="123456789012", region_name="us-east-1")
    assert key.value is key.value and key.value == value and key.size == BIG
    key.value = b"short"
    assert key.value == b"short" and key.etag == f'"{hashlib.md5(b"short").hexdigest()}"'


def test_in_memory_value_reads_writes_and_seeks_like_a_file() -> None:
    buffer = s3_server.InMemoryValue()
    buffer.write(b"hello ")
    buffer.write(bytearray(b"world"))
    buffer.seek(0)
    assert buffer.read(5) == b"hello" and buffer.read() == b" world" and buffer.tell() == 11
    buffer.seek(6)
    buffer.write(b"W")
    buffer.seek(0)
    whole = buffer.read()
    assert whole == b"hello World"
    buffer.seek(0)
    assert buffer.read() is whole
    buffer.seek(5)
    buffer.truncate()
    buffer.seek(0)
    assert buffer.read() == b"hello"


def test_range_gets_return_their_bytes_and_every_request_is_counted_and_delayed(server) -> None:
    s3 = boto3.client("s3", endpoint_url=server.url)
    s3.create_bucket(Bucket="bench-test")
    value = os.urandom(BIG)
    s3.put_object(Bucket="bench-test", Key="shard", Body=value)
    before = server.counts()
    ranges = [(0, 99), (5_000_001, 5_110_000), (BIG - 10, BIG - 1)]
    began = time.perf_counter()
    for start, end in ranges:
        assert s3.get_object(Bucket="bench-test", Key="shard", Range=f"bytes={start}-{end}")["Body"].read() == value[start : end + 1]
    elapsed = time.perf_counter() - began
    assert s3.get_object(Bucket="bench-test", Key="shard")["Body"].read() == value
    after = server.counts()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert before["PUT"] == 2  # the bucket and the object
    assert (delta["requests"], delta["GET"], delta["range_GET"]) == (4, 4, 3)
    assert delta["bytes_out"] == sum(end + 1 - start for start, end in ranges) + BIG
    assert elapsed >= len(ranges) * 0.05  # the latency is added to every request (a lower bound only)


def test_the_server_stops_by_itself_after_its_lifetime() -> None:
    running = s3_server.start(latency_s=0.0, lifetime_s=1.0)
    try:
        assert running.process.wait(timeout=60) == 0
    finally:
        running.stop()
