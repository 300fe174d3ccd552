"""gs:// and az:// URLs, each read by its own store's client, pointed at 127.0.0.1 by the store's
standard variables (``cloud_env``; nothing can reach another address). The test server's bucket
answers GCS's XML API and Azure's Blob API GETs as path-style S3 ones, so the records read are
the folder's; missing credentials or an unreachable endpoint is one line naming the URL within
the retry time, from the library and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from remote_env import BUCKET, GCS_BUCKET, cloud_env
from s3_server import NoCredentials, S3Server, free_port

from imgpipe.errors import RemoteError
from imgpipe.format.shardset import open_shardset
from imgpipe.loaders.torch import make_torch_loader

sys.path.insert(0, str(Path(__file__).parents[1]))
from _cli import assert_one_line_error  # noqa: E402

URLS = {"gs": f"gs://{GCS_BUCKET}/packed", "az": f"az://{BUCKET}/packed"}
RETRY_S = 2.0
BOUND_S = RETRY_S + 10  # the retry time, obstore's last try and the helper's start


@pytest.fixture(scope="session")
def cloud_packed(s3_server: S3Server, remote_packed: str, packed_dir: Path) -> dict[str, str]:
    """``packed_dir`` in the server's buckets, as URLS names it for each scheme."""
    s3_server.upload(packed_dir, GCS_BUCKET, "packed", public=True)
    return URLS


def _info(url: str) -> subprocess.CompletedProcess[str]:
    """``imgpipe info URL`` with this test's environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "imgpipe", "info", url], capture_output=True, text=True, timeout=60, env=env)


def _batches(path: object) -> list[tuple[np.ndarray, np.ndarray]]:
    loader = make_torch_loader(path, batch_size=4, image_size=32, normalize=False, device=None, seed=5, rank=0, world_size=1, workers=2)
    try:
        return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]
    finally:
        loader.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_gs_and_az_urls_are_read_by_their_own_clients_as_the_folder(
    s3_server: S3Server, cloud_packed: dict[str, str], packed_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scheme: str
) -> None:
    """AWS_ENDPOINT_URL is a closed port here: only the scheme's own client reaches the server."""
    cloud_env(monkeypatch, scheme, s3_server.endpoint, tmp_path)
    url = cloud_packed[scheme]
    local, remote = open_shardset(packed_dir), open_shardset(url)
    assert len(remote) == len(local) and np.array_equal(remote.labels, local.labels)
    records = remote.fetch(np.arange(len(remote)))
    assert all(records.read_view(i)[1] == local.read(i)[1] for i in range(len(local)))
    assert remote.describe(3).startswith(f"{url}/train-0000")
    remote_batches, local_batches = _batches(url), _batches(packed_dir)  # forked workers make their own client
    assert len(remote_batches) == len(local_batches) > 0
    assert all(np.array_equal(a, b) for r, here in zip(remote_batches, local_batches) for a, b in zip(r, here))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_missing_gs_or_az_credentials_are_one_line_naming_the_url_and_the_variables(
    s3_server: S3Server, cloud_packed: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scheme: str
) -> None:
    """No key, token or service account: the client asks the instance's credential service, which has none."""
    url = cloud_packed[scheme]
    variable = "GOOGLE_SERVICE_ACCOUNT" if scheme == "gs" else "AZURE_STORAGE_ACCOUNT_KEY"
    with NoCredentials() as service:
        cloud_env(monkeypatch, scheme, s3_server.endpoint, tmp_path, anonymous=False, credentials=service.address)
        monkeypatch.setenv("IMGPIPE_REMOTE_TIMEOUT", str(RETRY_S))
        start = time.monotonic()
        with pytest.raises(RemoteError) as info:
            open_shardset(url)
        assert time.monotonic() - start < BOUND_S
        message = str(info.value)
        assert message.startswith(f"{url}: no credentials: ") and variable in message and "\n" not in message
        assert_one_line_error(_info(url), f"{url}: no credentials: ", variable)
    token_path = "/computeMetadata/v1/instance/service-accounts/default/token" if scheme == "gs" else "/metadata/identity/oauth2/token"
    assert service.paths and all(path.startswith(token_path) for path in service.paths)  # the scheme's own credential chain asked


@pytest.mark.timeout(120)
@pytest.mark.parametrize("anonymous", [True, False], ids=["anonymous", "no-credentials"])
@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_an_unreachable_gs_or_az_endpoint_is_one_line_within_the_retry_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scheme: str, anonymous: bool
) -> None:
    """The store and the credential service both a closed port (a machine outside the cloud, offline)."""
    pytest.importorskip("obstore", reason="reading a URL needs obstore (pip install 'imgpipe[remote]')")
    cloud_env(monkeypatch, scheme, f"http://127.0.0.1:{free_port()}", tmp_path, anonymous=anonymous)
    monkeypatch.setenv("IMGPIPE_REMOTE_TIMEOUT", str(RETRY_S))
    url = URLS[scheme]
    start = time.monotonic()
    with pytest.raises(RemoteError) as info:
        open_shardset(url)
    assert time.monotonic() - start < BOUND_S
    message = str(info.value)
    assert message.startswith(url) and "\n" not in message
    if anonymous:
        assert message.startswith(f"{url}/manifest.json: ") and "gave up after" in message
    assert_one_line_error(_info(url), url)
