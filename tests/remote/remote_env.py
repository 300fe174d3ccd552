"""The AWS environment of one remote-storage test, and the bucket the tests use."""

from __future__ import annotations

from pathlib import Path

import pytest

BUCKET = "imgpipe-test"
_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "IMGPIPE_REMOTE_TIMEOUT")


def aws_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str], tmp: Path) -> None:
    """Set ``values`` for this test only, with no profile or credentials file of the machine in the way."""
    for name in _UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp / "no-config"))
    for name, value in values.items():
        monkeypatch.setenv(name, value)
