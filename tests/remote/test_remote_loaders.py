"""Whole epochs from a bucket equal those from the local folder: labels and pixels, both backends,
forked workers, world sizes 1 and 2 (real gloo), with faults and stalled responses in the way; a
record that stays unreadable is skipped or named; a server that stops mid-epoch, or a response
that stalls past the retry time, is named in one line."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gloo_ranks import free_port, run_two_ranks
from remote_env import BUCKET, aws_env
from s3_server import STALLS, FaultProxy, S3Server

from imgpipe.cache.opening import open_shards
from imgpipe.errors import DatasetError
from imgpipe.loaders.torch import RingRequests, make_torch_loader

SIZE = 32


def _epochs(loader, epochs: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    try:
        return [(x.numpy().copy(), y.numpy().copy()) for _ in range(epochs) for x, y in loader]
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()


def _torch(path: object, **kwargs):
    kwargs.setdefault("workers", 2)
    return make_torch_loader(path, batch_size=4, image_size=SIZE, normalize=False, device=None, seed=5, rank=0, world_size=1, **kwargs)


def _assert_same(remote: list, local: list) -> None:
    assert len(remote) == len(local) > 0
    for (x1, y1), (x2, y2) in zip(remote, local):
        assert np.array_equal(y1, y2) and np.array_equal(x1, x2)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", [None, "slowdown", "truncate", "reset", "corrupt"])
def test_torch_epochs_from_a_bucket_equal_the_folder_with_forked_workers(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, fault: str | None
) -> None:
    """Forked workers each make their own obstore client (the process that opened the URL only used its helper)."""
    fault_proxy.inject(fault, every=3)
    remote = _epochs(_torch(remote_packed, block_shuffle=4))
    _assert_same(remote, _epochs(_torch(packed_dir, block_shuffle=4)))
    if fault is not None:
        assert fault_proxy.counts.faults[fault] > 0


def test_a_worker_fetches_the_records_of_the_batches_queued_to_it() -> None:
    """With prefetch_factor p, each of w workers has p requests queued: request j names the next p - 1 of its worker's."""
    batches = [np.array([j]) for j in range(10)]
    for depth, expected in ((1, [[2]]), (3, [[2, 4, 6]])):
        requests = RingRequests(None, lookahead=2, depth=depth)  # 2 workers
        requests.start_pass(0, batches)
        ahead = [[int(b[0]) for b in request.ahead] for request in requests]
        assert ahead[:1] == expected and ahead[-3:] == [[9], [], []]
    local = RingRequests(None, depth=3)  # a local folder: nothing is fetched ahead
    local.start_pass(0, batches)
    assert all(request.ahead == () for request in local)


@pytest.mark.timeout(240)
def test_a_larger_prefetch_factor_reads_the_same_epochs_from_a_bucket(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path
) -> None:
    fault_proxy.inject("slowdown", every=3)
    _assert_same(_epochs(_torch(remote_packed, prefetch_factor=4), epochs=1), _epochs(_torch(packed_dir), epochs=1))


@pytest.mark.timeout(240)
def test_spawned_workers_and_no_workers_read_the_bucket_too(s3_env: S3Server, remote_packed: str, packed_dir: Path) -> None:
    local = _epochs(_torch(packed_dir, workers=0), epochs=1)
    _assert_same(_epochs(_torch(remote_packed, workers=0), epochs=1), local)
    _assert_same(_epochs(_torch(remote_packed, workers=1, multiprocessing_context="spawn"), epochs=1), local)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", [None, "truncate"])
def test_dali_epochs_from_a_bucket_equal_the_folder(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, fault: str | None, require_dali: None
) -> None:
    from imgpipe.loaders.dali import make_dali_loader

    def dali(path: object) -> list:
        return _epochs(
            make_dali_loader(path, batch_size=4, image_size=SIZE, normalize=False, device=None, workers=1, seed=5, rank=0, world_size=1)
        )

    fault_proxy.inject(fault, every=3)
    _assert_same(dali(remote_packed), dali(packed_dir))


RANK_SCRIPT = """
import sys, numpy as np, torch.distributed as dist
from imgpipe.loaders.torch import RingRequests, make_torch_loader
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
loader = make_torch_loader({url!r}, batch_size=4, image_size={size}, normalize=False, device=None, seed=5, workers=2)
images, labels = [], []
for epoch in range(2):
    for x, y in loader:
        images.append(x.numpy().copy()); labels.append(y.numpy().copy())
np.savez(sys.argv[2], images=np.stack(images), labels=np.stack(labels))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_gloo_ranks_read_their_parts_of_the_bucket_through_faults(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(port=free_port(), url=remote_packed, size=SIZE))
    fault_proxy.inject("slowdown", every=4)
    for rank, got in enumerate(run_two_ranks(script, tmp_path, timeout=280)):
        local = _epochs(
            make_torch_loader(
                packed_dir, batch_size=4, image_size=SIZE, normalize=False, device=None, seed=5, workers=0, rank=rank, world_size=2
            )
        )
        _assert_same(list(zip(got["images"], got["labels"])), local)
    assert fault_proxy.counts.faults["slowdown"] > 0


DALI_RANK_SCRIPT = """
import os, sys, time, numpy as np, torch.distributed as dist
from imgpipe.loaders.dali import make_dali_loader
rank, cache = int(sys.argv[1]), {cache!r}
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
loader = make_dali_loader({url!r}, batch_size=4, image_size={size}, normalize=False, device=None, seed=5, workers=1, cache_dir=cache)
images, labels = [], []
for epoch in range(2):
    for x, y in loader:
        images.append(x.numpy().copy()); labels.append(y.numpy().copy())
loader.close()
np.savez(sys.argv[2], images=np.stack(images), labels=np.stack(labels))
deadline = time.monotonic() + 240
while cache and not os.path.exists(os.path.join(cache, "manifest.json")) and time.monotonic() < deadline:  # its helper fills
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("cached", [False, True], ids=["stream", "cache_dir"])
def test_two_gloo_ranks_of_dali_read_their_parts_of_the_bucket(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path, cached: bool, require_dali: None
) -> None:
    """Each rank's DALI batches from the bucket (streamed, or through one cache the two ranks share) equal
    that rank's DALI batches from the local folder, through SlowDown on every other request, index files included
    (a cache reads most records from the few shard-long GETs of its background fill)."""
    from imgpipe.loaders.dali import make_dali_loader

    cache = str(tmp_path / "cache") if cached else None
    script = tmp_path / "rank.py"
    script.write_text(DALI_RANK_SCRIPT.format(port=free_port(), url=remote_packed, size=SIZE, cache=cache))
    fault_proxy.inject("slowdown", every=2, match="")
    for rank, got in enumerate(run_two_ranks(script, tmp_path, timeout=380)):
        local = _epochs(
            make_dali_loader(
                packed_dir, batch_size=4, image_size=SIZE, normalize=False, device=None, seed=5, workers=1, rank=rank, world_size=2
            )
        )
        _assert_same(list(zip(got["images"], got["labels"])), local)
    assert fault_proxy.counts.faults["slowdown"] > 0
    if cache is not None:  # the shared cache ends as a packed folder that verifies
        done = subprocess.run([sys.executable, "-m", "imgpipe", "verify", cache], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and ": OK: checked 60 records in 3 shard(s)" in done.stdout, done.stdout + done.stderr


@pytest.fixture
def damaged(s3_env: S3Server, packed_dir: Path) -> tuple[str, int]:
    """The packed folder uploaded with one byte of record 7's image flipped: (URL, 7)."""
    local = open_shards(packed_dir)
    shard, start, end = local.location(7)
    data = bytearray((packed_dir / local.rec_names[shard]).read_bytes())
    data[end - 16] ^= 0xFF
    url = s3_env.upload(packed_dir, BUCKET, "damaged-loader")
    s3_env.put(BUCKET, f"damaged-loader/{local.rec_names[shard]}", bytes(data))
    return url, 7


@pytest.mark.timeout(180)
def test_a_record_damaged_in_the_bucket_is_skipped_or_named(damaged: tuple[str, int], packed_dir: Path) -> None:
    url, bad = damaged
    skip = _torch(url, workers=2, on_corrupt="skip", shuffle=False)
    batches = _epochs(skip, epochs=1)
    assert len(batches) == len(_epochs(_torch(packed_dir, workers=0, shuffle=False), epochs=1)) and skip.skipped == 1
    with pytest.raises(DatasetError) as info:
        _epochs(_torch(url, workers=2, shuffle=False), epochs=1)
    message = str(info.value)
    assert f"{url}/train-00000-of-00002.rec record {bad} (id " in message and "crc32 differs" in message and "\n" not in message


@pytest.mark.timeout(180)
def test_a_server_stopped_mid_epoch_is_named_in_one_line(packed_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with S3Server(lifetime_s=300) as server:
        url = server.upload(packed_dir, BUCKET, "stops")
        aws_env(monkeypatch, {**server.env(), "IMGPIPE_REMOTE_TIMEOUT": "2"}, tmp_path)
        loader = _torch(url, workers=2)
        batches = iter(loader)
        next(batches)
        server.stop()
        with pytest.raises(DatasetError) as info:
            for _ in batches:
                pass
        loader.close()
    message = str(info.value)
    assert message.startswith(f"{url}/train-0000") and " record " in message and "gave up after" in message and "\n" not in message


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stall", STALLS)
def test_a_stalled_response_is_cut_off_and_fetched_again_with_the_same_batches(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, monkeypatch: pytest.MonkeyPatch, stall: str
) -> None:
    """Three record GETs stall (half a body then silence, or no answer): each is cut off well before the retry time is up."""
    monkeypatch.setenv("IMGPIPE_REMOTE_TIMEOUT", "6")
    fault_proxy.inject(stall, every=4, limit=3)
    remote = _epochs(_torch(remote_packed, block_shuffle=4), epochs=1)
    _assert_same(remote, _epochs(_torch(packed_dir, block_shuffle=4), epochs=1))
    assert fault_proxy.counts.faults[stall] == 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stall", STALLS)
def test_a_stall_past_the_retry_time_is_one_line_naming_the_url_shard_and_record(
    fault_proxy: FaultProxy, remote_packed: str, monkeypatch: pytest.MonkeyPatch, stall: str
) -> None:
    monkeypatch.setenv("IMGPIPE_REMOTE_TIMEOUT", "3")
    loader = _torch(remote_packed, workers=2)
    fault_proxy.inject(stall)  # every record read from now on; the index is in
    start = time.monotonic()
    with pytest.raises(DatasetError) as info:
        for _ in loader:
            pass
    loader.close()
    assert time.monotonic() - start < 3 + 15
    message = str(info.value)
    assert re.match(rf"{re.escape(remote_packed)}/train-0000[01]-of-00002\.rec record \d+ \(id \d+", message), message
    tries = re.search(r"gave up after (\d+) tries", message)
    assert tries is not None and int(tries[1]) >= 2 and "\n" not in message, message  # cut off and tried again
