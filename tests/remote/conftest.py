"""Fixtures of the remote-storage tests: a real S3-API server (moto, a subprocess on 127.0.0.1 with a
bounded lifetime), the packed test folder uploaded to it, the AWS variables set for one test only,
and a fault-injecting proxy in front of the server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from remote_env import BUCKET, aws_env  # noqa: E402
from s3_server import FaultProxy, S3Server  # noqa: E402


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="moto[server] is a dev dependency (pip install 'imgpipe[dev]')")
    pytest.importorskip("boto3", reason="boto3 is a dev dependency (pip install 'imgpipe[dev]')")
    pytest.importorskip("obstore", reason="reading a URL needs obstore (pip install 'imgpipe[remote]')")
    with S3Server(lifetime_s=1800) as server:
        yield server


@pytest.fixture(scope="session")
def remote_packed(s3_server: S3Server, packed_dir: Path) -> str:
    """``packed_dir`` uploaded to the server: its s3:// URL (read-only, as ``packed_dir``)."""
    return s3_server.upload(packed_dir, BUCKET, "packed", public=True)


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Server:
    """The AWS variables pointing at the server, for this test only."""
    aws_env(monkeypatch, s3_server.env(), tmp_path)
    return s3_server


@pytest.fixture
def fault_proxy(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FaultProxy]:
    """A proxy in front of the server, the AWS variables pointing at it, for this test only."""
    with FaultProxy(s3_server.port) as proxy:
        aws_env(monkeypatch, s3_server.env(proxy.endpoint), tmp_path)
        yield proxy
