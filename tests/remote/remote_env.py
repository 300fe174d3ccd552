"""The store environment of one remote-storage test, and the buckets the tests use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from s3_server import free_port

BUCKET = "imgpipe-test"
GCS_BUCKET = "imgpipegcs"  # GCS's client sends a bucket name's '-' as %2D, which the test server does not decode
AZURE_ACCOUNT = "imgpipe"
_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "IMGPIPE_REMOTE_TIMEOUT")
_STORE_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "GCE_METADATA_")


def aws_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str], tmp: Path) -> None:
    """Set ``values`` for this test only, with no profile or credentials file of the machine in the way."""
    for name in _UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp / "no-config"))
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def cloud_env(
    monkeypatch: pytest.MonkeyPatch, scheme: str, endpoint: str, tmp: Path, *, anonymous: bool = True, credentials: str | None = None
) -> None:
    """Point the ``gs`` or ``az`` client at ``endpoint`` (on 127.0.0.1) and at no other address, for this test only.

    Every store variable of the machine is removed and HOME is ``tmp`` (no gcloud or Azure CLI
    files). The credential services a client without credentials asks (GCE's metadata server,
    Azure's managed identity endpoint) are at ``credentials`` (``host:port`` on 127.0.0.1; default
    a closed port), and AWS_ENDPOINT_URL is a closed port: a URL given to the S3 client by mistake
    fails there. ``anonymous``: requests are not signed (a public bucket); else the client has no
    credentials at all and asks those services.
    """
    closed = f"127.0.0.1:{free_port()}"
    service = credentials or closed
    for name in list(os.environ):
        if name.startswith(_STORE_PREFIXES):
            monkeypatch.delenv(name)
    aws_env(monkeypatch, {"AWS_ENDPOINT_URL": f"http://{closed}", "AWS_ACCESS_KEY_ID": "unused", "AWS_SECRET_ACCESS_KEY": "unused"}, tmp)
    monkeypatch.setenv("HOME", str(tmp))
    monkeypatch.setenv("GCE_METADATA_HOST", service)
    monkeypatch.setenv("GCE_METADATA_IP", service)
    monkeypatch.setenv("AZURE_MSI_ENDPOINT", f"http://{service}/metadata/identity/oauth2/token")
    if scheme == "gs":
        monkeypatch.setenv("GOOGLE_BASE_URL", endpoint)
    elif scheme == "az":
        monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", endpoint)
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", AZURE_ACCOUNT)
    else:
        raise ValueError(f"scheme must be gs or az, got {scheme!r}")
    if anonymous:
        monkeypatch.setenv("GOOGLE_SKIP_SIGNATURE" if scheme == "gs" else "AZURE_SKIP_SIGNATURE", "true")
