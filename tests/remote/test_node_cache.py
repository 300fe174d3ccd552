"""A node-local ``cache_dir`` in front of a bucket (a real S3-API server, real processes): whole epochs
equal those of the local folder, both backends, with faults; the cache fills, ends as a packed folder
that verifies, and serves the next run; ranks and their workers share it; kill -9 and bytes a power
loss left wrong are survived; a changed dataset starts it afresh; a disk too small is one line."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from gloo_ranks import free_port, run_two_ranks
from remote_env import BUCKET
from s3_server import FaultProxy, S3Server

sys.path.insert(0, str(Path(__file__).parents[1]))
from _cli import assert_one_line_error  # noqa: E402
from _fs import PAGE, fill, tmpfs  # noqa: E402
from train.proctree import descendants, wait_gone  # noqa: E402

from imgpipe.cache.checkout import open_cache  # noqa: E402
from imgpipe.cache.nodecache import STATE_DIR  # noqa: E402
from imgpipe.cache.opening import open_shards  # noqa: E402
from imgpipe.cache.shardfill import fetch_spans  # noqa: E402
from imgpipe.errors import ConfigError, DatasetError  # noqa: E402
from imgpipe.format.manifest import load_manifest  # noqa: E402
from imgpipe.loaders.torch import make_torch_loader  # noqa: E402

SIZE = 32
FILL_S = 60  # the longest a test waits for the background fill of its tiny dataset


def _epochs(loader, epochs: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    try:
        return [(x.numpy().copy(), y.numpy().copy()) for _ in range(epochs) for x, y in loader]
    finally:
        loader.close()


def _torch(path: object, **kwargs):
    kwargs.setdefault("workers", 2)
    return make_torch_loader(
        path, batch_size=4, image_size=SIZE, normalize=False, device=None, seed=5, rank=0, world_size=1, block_shuffle=4, **kwargs
    )


def _assert_same(got: list, expected: list) -> None:
    assert len(got) == len(expected) > 0
    for (x1, y1), (x2, y2) in zip(got, expected):
        assert np.array_equal(y1, y2) and np.array_equal(x1, x2)


def _wait_complete(folder: Path) -> None:
    deadline = time.monotonic() + FILL_S
    while not (folder / "manifest.json").is_file():
        assert time.monotonic() < deadline, f"{folder} did not fill within {FILL_S} s: {sorted(p.name for p in folder.iterdir())}"
        time.sleep(0.05)


def _verify(folder: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "imgpipe", "verify", str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and ": OK: checked 60 records in 3 shard(s)" in done.stdout, done.stdout + done.stderr


def _present_records_are_right(folder: Path, packed: Path) -> int:
    """Every record the cache marks present holds the folder's bytes, and every complete shard is whole; the present count."""
    present_count = 0
    for split in ("train", "val"):
        local = open_shards(packed, split)
        state = folder / STATE_DIR
        present = np.fromfile(state / f"{split}.present", np.uint8) if (state / f"{split}.present").exists() else np.zeros(0, np.uint8)
        complete = np.fromfile(state / f"{split}.complete", np.uint8) if (state / f"{split}.complete").exists() else np.zeros(0, np.uint8)
        for i in np.flatnonzero(present).tolist():
            shard, start, end = local.location(i)
            with open(folder / local.rec_names[shard], "rb") as f:
                f.seek(start)
                assert f.read(end - start) == (packed / local.rec_names[shard]).read_bytes()[start:end], (split, i)
        for s in np.flatnonzero(complete).tolist():
            name = local.rec_names[s]
            assert hashlib.sha256((folder / name).read_bytes()).digest() == hashlib.sha256((packed / name).read_bytes()).digest()
        present_count += int(present.sum())
    return present_count


# ---------------------------------------------------------------------------- the whole path


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", [None, "truncate", "corrupt"])
def test_epochs_through_a_cache_equal_the_folder_then_it_verifies_and_serves_the_next_run(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path, fault: str | None
) -> None:
    cache = tmp_path / "cache"
    fault_proxy.inject(fault, every=2)  # every other record read: the loaders' and the background fill's
    local = _epochs(_torch(packed_dir))
    _assert_same(_epochs(_torch(remote_packed, cache_dir=cache)), local)
    _wait_complete(cache)
    if fault is not None:
        assert fault_proxy.counts.faults[fault] > 0
    fault_proxy.inject(None)
    assert not [path for path in fault_proxy.counts.bodies if ".idx" in path]  # the node wrote each .idx from the index sidecar
    _verify(cache)
    _assert_same(_epochs(_torch(cache)), local)  # a packed folder like any other
    gets = fault_proxy.counts.gets
    _assert_same(_epochs(_torch(remote_packed, cache_dir=cache)), local)
    assert fault_proxy.counts.gets - gets == 1  # the manifest, to tell the version; nothing else


@pytest.mark.timeout(240)
def test_spawned_workers_and_no_workers_read_through_the_cache_too(
    s3_env: S3Server, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    local = _epochs(_torch(packed_dir, workers=0), epochs=1)
    _assert_same(_epochs(_torch(remote_packed, workers=1, multiprocessing_context="spawn", cache_dir=tmp_path / "a"), epochs=1), local)
    _assert_same(_epochs(_torch(remote_packed, workers=0, cache_dir=tmp_path / "b"), epochs=1), local)


@pytest.mark.timeout(300)
def test_dali_epochs_through_a_cache_equal_the_folder(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path, require_dali: None
) -> None:
    from imgpipe.loaders.dali import make_dali_loader

    def dali(path: object, **kwargs) -> list:
        return _epochs(
            make_dali_loader(
                path, batch_size=4, image_size=SIZE, normalize=False, device=None, workers=1, seed=5, rank=0, world_size=1, **kwargs
            )
        )

    fault_proxy.inject("slowdown", every=3)
    _assert_same(dali(remote_packed, cache_dir=tmp_path / "cache"), dali(packed_dir))
    _wait_complete(tmp_path / "cache")
    _verify(tmp_path / "cache")


RANK_SCRIPT = """
import os, sys, time, numpy as np, torch.distributed as dist
from imgpipe.loaders.torch import make_torch_loader
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
loader = make_torch_loader({url!r}, batch_size=4, image_size={size}, normalize=False, device=None, seed=5, workers=2, cache_dir={cache!r})
images, labels = [], []
for epoch in range(2):
    for x, y in loader:
        images.append(x.numpy().copy()); labels.append(y.numpy().copy())
np.savez(sys.argv[2], images=np.stack(images), labels=np.stack(labels))
deadline = time.monotonic() + 240
while not os.path.exists(os.path.join({cache!r}, "manifest.json")) and time.monotonic() < deadline:  # this rank's helper fills its share
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_gloo_ranks_and_their_workers_share_one_cache_through_faults(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(port=free_port(), url=remote_packed, size=SIZE, cache=str(cache)))
    fault_proxy.inject("slowdown", every=2, match="")  # every other request, index files included
    for rank, got in enumerate(run_two_ranks(script, tmp_path, timeout=360)):
        local = _epochs(
            make_torch_loader(
                packed_dir, batch_size=4, image_size=SIZE, normalize=False, device=None, seed=5, workers=0, rank=rank, world_size=2
            )
        )
        _assert_same(list(zip(got["images"], got["labels"])), local)
    assert fault_proxy.counts.faults["slowdown"] > 0
    _verify(cache)


OPENER = """
import os, sys, time
from imgpipe.cache.opening import open_shards
open_shards(sys.argv[1], sys.argv[3], cache_dir=sys.argv[2])
deadline = time.monotonic() + 240
while not os.path.exists(os.path.join(sys.argv[2], "manifest.json")) and time.monotonic() < deadline:  # its helper fills its share
    time.sleep(0.05)
"""


@pytest.mark.timeout(300)
def test_the_processes_of_a_node_fetch_each_shard_once(
    s3_server: S3Server, packed_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three processes open one cache at once (as the ranks of a node do) over a slow link, so their
    background fills overlap: each shard is claimed by one of them and fetched once, in one request."""
    from remote_env import aws_env

    with FaultProxy(s3_server.port, bytes_per_s=400_000) as slow:
        aws_env(monkeypatch, s3_server.env(slow.endpoint), tmp_path)
        url = s3_server.upload(packed_dir, BUCKET, "claimed")
        openers = [
            subprocess.Popen([sys.executable, "-c", OPENER, url, str(tmp_path / "cache"), split], env=os.environ.copy())
            for split in ("train", "train", "val")
        ]
        assert [p.wait(timeout=240) for p in openers] == [0, 0, 0]
    for shard in packed_dir.glob("*.rec"):
        assert slow.counts.bodies[f"/{BUCKET}/claimed/{shard.name}"] == [shard.stat().st_size]
    _verify(tmp_path / "cache")


# ---------------------------------------------------------------------------- kill -9 and power loss

READER = """
import sys
from imgpipe.loaders.torch import make_torch_loader
loader = make_torch_loader(sys.argv[1], batch_size=4, image_size=32, normalize=False, device=None, seed=5, rank=0, world_size=1, workers=2,
                           cache_dir=sys.argv[2])
print("opened", flush=True)
for epoch in range(100):
    for x, y in loader:
        print("batch", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_cache_killed_at_any_moment_stays_right_and_the_next_run_finishes_it(
    s3_server: S3Server, packed_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL the reading process (and so its store helper, which fills) at moments from its start to
    mid-epoch (counted in batches read, not seconds): every record marked present holds the right bytes,
    every complete shard is whole; then a new run reads the same epochs and the cache ends whole."""
    from remote_env import aws_env

    with FaultProxy(s3_server.port, latency_s=0.05, bytes_per_s=200_000) as slow:  # a slow link: the kills land while shards stream in
        aws_env(monkeypatch, s3_server.env(slow.endpoint), tmp_path)
        url = s3_server.upload(packed_dir, BUCKET, "killed")
        cache = tmp_path / "cache"
        seen = []
        for batches in (0, 1, 3, 6, 9):  # the moments, counted in the batches the reader got (12 an epoch)
            reader = subprocess.Popen(
                [sys.executable, "-c", READER, url, str(cache)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
            )
            assert reader.stdout is not None and reader.stdout.readline().strip() == "opened"
            assert [reader.stdout.readline().strip() for _ in range(batches)] == ["batch"] * batches
            helpers = descendants(reader.pid)  # its store helper, which fills, and its loader workers
            reader.kill()  # SIGKILL
            reader.wait(timeout=30)
            assert wait_gone(helpers, 10) == []  # they die with it (their parent-death signal)
            seen.append(_present_records_are_right(cache, packed_dir))
            assert not (cache / "manifest.json").exists() or seen[-1] == 60
        assert seen[0] < 60  # the first kill lands before the cache is whole
        _assert_same(_epochs(_torch(url, cache_dir=cache)), _epochs(_torch(packed_dir)))
        _wait_complete(cache)
    _verify(cache)


def _lose_record(cache: Path, packed: Path, i: int) -> None:
    """Make the cache look as a power loss may leave it: record ``i``'s bytes gone (zeros), its presence byte kept,
    its shard not complete."""
    shards = open_shards(packed)
    shard, start, end = shards.location(i)
    with open(cache / shards.rec_names[shard], "r+b") as f:
        f.seek(start)
        f.write(bytes(end - start))
    (cache / "manifest.json").unlink(missing_ok=True)
    complete = np.memmap(cache / STATE_DIR / "train.complete", np.uint8, "r+")
    complete[shard] = 0
    complete.flush()
    assert np.fromfile(cache / STATE_DIR / "train.present", np.uint8)[i] == 1


@pytest.mark.timeout(240)
def test_after_a_power_loss_the_records_of_shards_not_complete_are_fetched_again(
    s3_env: S3Server, packed_dir: Path, tmp_path: Path
) -> None:
    """The first run of a new boot forgets the presence bytes of shards not complete: a record whose bytes
    the power loss took is fetched again, the shard completes and the folder verifies."""
    url = s3_env.upload(packed_dir, BUCKET, "power")
    cache = tmp_path / "cache"
    local = _epochs(_torch(packed_dir))
    _epochs(_torch(url, cache_dir=cache), epochs=1)
    _wait_complete(cache)
    _lose_record(cache, packed_dir, 7)
    (cache / STATE_DIR / "boot_id").write_text("the boot before the power loss")
    _assert_same(_epochs(_torch(url, cache_dir=cache)), local)
    _wait_complete(cache)
    _verify(cache)


@pytest.mark.timeout(240)
def test_a_cached_record_that_fails_its_check_is_fetched_again_and_rewritten(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loaders check every record they read from a shard not complete (framing, crc32), so wrong bytes
    behind a presence byte are never used. The background fill is left out here: it would complete the shard first."""
    monkeypatch.setattr("imgpipe.cache.opening.start_filling", lambda *args: None)
    cache = tmp_path / "cache"
    local = open_shards(packed_dir)
    through = open_shards(remote_packed, cache_dir=cache)
    assert [through.read(i)[1] for i in range(48)] == [local.read(i)[1] for i in range(48)]  # fetched, checked, cached
    _lose_record(cache, packed_dir, 7)
    gets = fault_proxy.counts.matching_gets
    again = open_shards(remote_packed, cache_dir=cache)
    assert [again.read(i)[1] for i in range(48)] == [local.read(i)[1] for i in range(48)]
    assert fault_proxy.counts.matching_gets - gets == 1  # record 7 only
    shard, start, end = local.location(7)
    assert (cache / local.rec_names[shard]).read_bytes()[start:end] == (packed_dir / local.rec_names[shard]).read_bytes()[start:end]


@pytest.mark.timeout(240)
def test_a_shard_is_checked_from_the_disk_record_by_record_and_only_a_wrong_record_is_fetched_again(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    """Before a shard is complete every record is read back from the disk and checked (framing, crc32): a
    record whose bytes went wrong behind its presence byte is found there, and it alone is fetched again."""
    cache = tmp_path / "cache"
    open_shards(remote_packed, cache_dir=cache)
    _wait_complete(cache)
    _lose_record(cache, packed_dir, 7)
    shard, start, end = open_shards(packed_dir).location(7)
    name = open_shards(packed_dir).rec_names[shard]
    before = {path: list(sizes) for path, sizes in fault_proxy.counts.bodies.items()}
    open_shards(remote_packed, cache_dir=cache)  # its background fill finds the shard not complete
    _wait_complete(cache)
    assert (cache / name).read_bytes() == (packed_dir / name).read_bytes()
    fetched = [
        size for path, sizes in fault_proxy.counts.bodies.items() if path.endswith(name) for size in sizes[len(before.get(path, [])) :]
    ]
    assert fetched == [end - start]  # record 7, not the shard again
    _verify(cache)


@pytest.mark.timeout(240)
def test_a_record_damaged_in_the_store_leaves_its_shard_not_complete_with_one_warning(
    s3_env: S3Server, packed_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The stored shard differs from what the pack wrote in one record's payload: it fails its crc32 in
    both fetches alike, so the shard is never marked complete and the fill (in the store helper) says the
    store is damaged."""
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for path in packed_dir.iterdir():
        if path.is_file():
            (damaged / path.name).write_bytes(path.read_bytes())
    shard, start, end = open_shards(packed_dir).location(7)
    name = open_shards(packed_dir).rec_names[shard]
    data = bytearray((damaged / name).read_bytes())
    data[end - 8] ^= 0xFF  # inside the JPEG's bytes: the framing holds, the crc32 does not
    (damaged / name).write_bytes(bytes(data))
    url = s3_env.upload(damaged, BUCKET, "damaged")
    cache = tmp_path / "cache"
    open_shards(url, cache_dir=cache)
    seen: list[str] = []
    _wait_for("the stored shard is damaged", seen, capfd)
    warned = "".join(seen)
    assert f"{name}: records of it fail their checks twice alike: the stored shard is damaged" in warned and "imgpipe verify" in warned
    assert warned.count("the stored shard is damaged") == 1
    complete = np.fromfile(cache / STATE_DIR / "train.complete", np.uint8)
    assert complete[shard] == 0 and not (cache / "manifest.json").exists()


def _padding_byte(packed: Path, i: int) -> tuple[int, int, str, int]:
    """(record, shard number, shard name, file offset) of a padding byte of train record ``i`` or the first record after
    it that has one: bytes between a record's payload and the next record, outside every record's crc32."""
    from imgpipe.format.recordio import FRAME_HEADER, LENGTH_MASK

    shards = open_shards(packed)
    for k in range(i, len(shards)):
        shard, start, end = shards.location(k)
        with open(packed / shards.rec_names[shard], "rb") as f:
            f.seek(start)
            length = FRAME_HEADER.unpack(f.read(FRAME_HEADER.size))[1] & LENGTH_MASK
        if start + FRAME_HEADER.size + length < end:
            return k, shard, shards.rec_names[shard], end - 1
    raise AssertionError("no record with padding")


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


@pytest.mark.timeout(240)
def test_a_shard_damaged_in_the_store_only_in_its_padding_is_never_complete_with_one_warning(
    s3_env: S3Server, packed_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The stored shard differs from the manifest in a byte between two records: every record's crc32 holds,
    the padding (zeros as dmlc writes it) does not, in both fetches alike. The shard is never marked complete,
    no manifest is written over it (verify would fail it on its sha256), and the fill says the store is damaged."""
    damaged = tmp_path / "damaged"
    shutil.copytree(packed_dir, damaged, ignore=shutil.ignore_patterns(".*"))
    _, shard, name, offset = _padding_byte(packed_dir, 3)
    _flip(damaged / name, offset)
    url = s3_env.upload(damaged, BUCKET, "padding")
    cache = tmp_path / "cache"
    open_shards(url, cache_dir=cache)
    seen: list[str] = []
    _wait_for("the stored shard is damaged", seen, capfd)
    warned = "".join(seen)
    assert f"{name}: records of it fail their checks twice alike: the stored shard is damaged" in warned
    assert warned.count("the stored shard is damaged") == 1
    deadline = time.monotonic() + FILL_S
    while not all(np.fromfile(cache / STATE_DIR / f"{split}.complete", np.uint8).sum() == n for split, n in (("train", 1), ("val", 1))):
        assert time.monotonic() < deadline, "the other shards did not complete"
        time.sleep(0.05)
    assert np.fromfile(cache / STATE_DIR / "train.complete", np.uint8)[shard] == 0 and not (cache / "manifest.json").exists()


@pytest.mark.timeout(240)
def test_a_cached_shard_wrong_only_in_its_padding_is_fetched_again_and_the_cache_verifies(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    """A power loss left a byte between two records wrong on the node's disk (every record's crc32 holds): the
    fill finds it before it marks the shard complete, fetches that record again, and the cache verifies."""
    cache = tmp_path / "cache"
    open_shards(remote_packed, cache_dir=cache)
    _wait_complete(cache)
    record, _, name, offset = _padding_byte(packed_dir, 7)
    _lose_record(cache, packed_dir, record)  # its shard not complete, every record's presence kept
    (cache / name).write_bytes((packed_dir / name).read_bytes())
    _flip(cache / name, offset)
    open_shards(remote_packed, cache_dir=cache)
    _wait_complete(cache)
    assert (cache / name).read_bytes() == (packed_dir / name).read_bytes()
    _verify(cache)


@pytest.mark.timeout(120)
def test_a_new_boot_forgets_the_presence_of_shards_not_complete(
    s3_env: S3Server, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    from imgpipe.format.manifest import fetch_manifest
    from imgpipe.storage.opening import open_source

    source = open_source(remote_packed)
    cache = open_cache(tmp_path / "cache", source, *fetch_manifest(source))
    present, complete = cache.present("train").array, cache.completed("train").array
    present[:] = 1
    complete[0] = 1  # shard 0 (records 0..23) was fsynced whole; shard 1 was not
    (tmp_path / "cache" / STATE_DIR / "boot_id").write_text("an earlier boot")
    open_cache(tmp_path / "cache", source, *fetch_manifest(source))
    records = open_shards(packed_dir).location
    assert present.tolist() == [1 if records(i)[0] == 0 else 0 for i in range(48)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hostile", [b"[" * 100_000 + b"]" * 100_000, b'{"manifest_sha256": Infinity}', b"\xff", b"[]"])
def test_a_cache_state_file_nobody_wrote_starts_the_cache_afresh(
    s3_env: S3Server, remote_packed: str, tmp_path: Path, hostile: bytes
) -> None:
    from imgpipe.cache.checkout import attach
    from imgpipe.cache.nodecache import SOURCE_NAME, cached_version
    from imgpipe.format.manifest import fetch_manifest
    from imgpipe.storage.opening import open_source

    source, folder = open_source(remote_packed), tmp_path / "cache"
    open_cache(folder, source, *fetch_manifest(source))
    (folder / STATE_DIR / SOURCE_NAME).write_bytes(hostile)
    assert cached_version(folder) is None and attach(folder) is None
    cache = open_cache(folder, source, *fetch_manifest(source))
    assert cached_version(folder) == cache.version and attach(folder) is not None


# ---------------------------------------------------------------------------- versions, space, mistakes


@pytest.mark.timeout(300)
def test_a_dataset_changed_upstream_starts_the_cache_afresh_and_says_so(
    s3_env: S3Server, packed_dir: Path, synth_tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from imgpipe.packing.packer import pack

    url = s3_env.upload(packed_dir, BUCKET, "changing")
    cache = tmp_path / "cache"
    _epochs(_torch(url, cache_dir=cache), epochs=1)
    _wait_complete(cache)
    repacked = tmp_path / "repacked"
    pack(synth_tree, repacked, shards="train=3,val=1", seed=1, workers=1, progress=False)
    for name in {p.name for p in packed_dir.iterdir()} - {p.name for p in repacked.iterdir()}:
        s3_env.client().delete_object(Bucket=BUCKET, Key=f"changing/{name}")
    s3_env.upload(repacked, BUCKET, "changing")

    holder = subprocess.Popen(  # another process still reads the old version: it holds the cache's lock shared, as every reader does
        [sys.executable, "-c", "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_SH)\n"
         "print('held', flush=True)\nsys.stdin.readline()", str(cache / STATE_DIR / "lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(DatasetError) as info:
        open_shards(url, cache_dir=cache)
    assert str(info.value).startswith(f"{cache}: cache_dir holds another version of {url}") and "another process still reads it" in str(
        info.value
    )
    holder.communicate("\n", timeout=30)

    with caplog.at_level(logging.WARNING, logger="imgpipe.cache.nodecache"):
        got = _epochs(_torch(url, cache_dir=cache))
    assert any("changed since it was cached" in r.getMessage() and "starting the cache afresh" in r.getMessage() for r in caplog.records)
    _assert_same(got, _epochs(_torch(repacked)))
    _wait_complete(cache)
    assert load_manifest(cache).to_json() == load_manifest(repacked).to_json()
    assert sorted(p.name for p in cache.glob("*.rec")) == sorted(p.name for p in repacked.glob("*.rec"))


@pytest.mark.timeout(120)
def test_a_disk_too_small_for_the_dataset_is_one_line_up_front(fault_proxy: FaultProxy, remote_packed: str, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "128k") as small:
        gets = fault_proxy.counts.gets
        with pytest.raises(DatasetError) as info:
            open_shards(remote_packed, cache_dir=small / "cache")
        message = str(info.value)
        assert message.startswith(f"{small / 'cache'}: cache_dir needs ") and f"more for {remote_packed}" in message and "free" in message
        assert "\n" not in message
        assert fault_proxy.counts.gets - gets == 1  # the manifest only
        done = subprocess.run(
            [sys.executable, "-m", "imgpipe", "train", "--set", f"data.path={remote_packed}", "--set", f"data.cache={small / 'train'}",
             "--set", "train.batch_size=8", "--set", f"output.dir={tmp_path / 'run'}", "--gpus", "0"],
            capture_output=True, text=True, timeout=100, env=os.environ.copy(),
        )  # fmt: skip
        assert_one_line_error(done, f"{small / 'train'}: cache_dir needs ", "free some space, give another cache_dir")


UNWRITABLE = "cannot write to cache_dir"


def _fill_settled(cache: Path, split: str, shards: int) -> bool:
    """True once no process of the node holds a claim on a shard of ``split`` (each fill thread releases its shard
    after it warned that the disk is full, if it did). This process holds none: closing the file drops nothing."""
    fd = os.open(cache / STATE_DIR / f"{split}.claims", os.O_RDONLY)
    try:
        for s in range(shards):
            try:
                fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, s)
            except OSError:
                return False
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, s)
        return True
    finally:
        os.close(fd)


def _wait_for(what: str, seen: list[str], capfd: pytest.CaptureFixture[str], timeout_s: float = FILL_S) -> None:
    """Wait until ``what`` was written to this process's stderr or its children's (the store helper's warnings)."""
    deadline = time.monotonic() + timeout_s
    while what not in "".join(seen):
        assert time.monotonic() < deadline, f"no {what!r} within {timeout_s} s: {''.join(seen)[-2000:]}"
        time.sleep(0.05)
        seen.append(capfd.readouterr().err)


@pytest.mark.timeout(300)
def test_a_disk_that_fills_mid_fill_serves_no_wrong_record_and_the_next_run_heals(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The space check passes; then another file fills the disk while the background fill's shard requests
    are in flight, so its writes come back short or fail. No record is marked present nor shard complete
    that the disk does not hold, every record read is the folder's, and the caching stops with one
    warning; once the space is free again, the next run finishes the cache, which verifies."""
    local = open_shards(packed_dir, "train")
    expected = [local.read(i) for i in range(len(local))]
    smallest = min((packed_dir / name).stat().st_size for name in local.rec_names)
    with tmpfs(tmp_path / "small", "2m") as small:
        cache = small / "cache"
        gate = fault_proxy.hold(".rec")  # the fill's shard requests (and the records the reads below fetch) wait
        shards = open_shards(remote_packed, "train", cache_dir=cache)
        deadline = time.monotonic() + FILL_S
        while fault_proxy.counts.held < len(local.rec_names):  # the background fill asked for every train shard
            assert time.monotonic() < deadline
            time.sleep(0.02)
        filler = fill(small, leave_pages=smallest // PAGE // 2)  # room for half a shard: its write comes back short
        gate.set()
        seen: list[str] = []
        _wait_for(UNWRITABLE, seen, capfd)
        assert [shards.read(i) for i in range(len(shards))] == expected  # from the URL where the folder lacks them
        deadline = time.monotonic() + FILL_S
        while not _fill_settled(cache, "train", len(local.rec_names)):  # every fill thread warned, if it would, then let go
            assert time.monotonic() < deadline, "the background fill still holds shards"
            time.sleep(0.02)
        seen.append(capfd.readouterr().err)
        warned = "".join(seen).count(UNWRITABLE) + sum(UNWRITABLE in r.getMessage() for r in caplog.records)
        assert warned == 1, ("".join(seen), caplog.text)  # one warning for the node: the store helper's, or this process's
        _present_records_are_right(cache, packed_dir)
        assert not (cache / "manifest.json").exists()
        with pytest.raises(DatasetError, match=f"{cache}: an incomplete node cache"):  # never read as bare .rec files, holes and all
            open_shards(cache, "train")
        shards.close()

        filler.unlink()  # space again: the next run heals what the full disk left
        _assert_same(_epochs(_torch(remote_packed, cache_dir=cache)), _epochs(_torch(packed_dir)))
        _wait_complete(cache)
        _verify(cache)
        again = open_shards(cache, "train")  # a packed folder now, read unchecked
        assert [again.read(i) for i in range(len(again))] == expected


@pytest.mark.timeout(120)
def test_mistakes_with_cache_dir_are_one_line(s3_env: S3Server, remote_packed: str, packed_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cache_dir caches a dataset read from a URL"):
        open_shards(packed_dir, cache_dir=tmp_path / "cache")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(
        ConfigError, match=r"cache_dir holds files and is no imgpipe cache \(no \.imgpipe-cache/ in it\); give an empty or new folder"
    ):
        open_shards(remote_packed, cache_dir=tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match="cache_dir applies to a URL"):
        make_torch_loader(open_shards(remote_packed), batch_size=4, device=None, cache_dir=tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-m", "imgpipe", "train", "--set", f"data.path={packed_dir}", "--set", f"data.cache={tmp_path / 'cache'}",
         "--gpus", "0"],
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert_one_line_error(done, "--set data.cache=", "data.cache keeps a dataset read from a URL on this node", "unset data.cache")


# ---------------------------------------------------------------------------- pieces


STORE_ON_A_FULL_DISK = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from _fs import fill
from imgpipe.cache.checkout import open_cache
from imgpipe.format.manifest import fetch_manifest
from imgpipe.storage.opening import open_source
source = open_source(sys.argv[1])
cache = open_cache(sys.argv[2], source, *fetch_manifest(source))
fill(Path(sys.argv[2]))  # another job takes the rest of the disk
present = cache.present("train").array
present[:] = 1  # a store into a page of the mapped state file
print(int(present.sum()), flush=True)
"""


@pytest.mark.timeout(120)
def test_a_presence_byte_stored_on_a_full_disk_is_no_crash(packed_dir: Path, tmp_path: Path) -> None:
    """The state files get their blocks when the cache is opened: a store into a mapped page that a full
    tmpfs cannot back would kill the process with SIGBUS (it did: the files were sparse)."""
    with tmpfs(tmp_path / "small", "1m") as small:
        done = subprocess.run(
            [sys.executable, "-c", STORE_ON_A_FULL_DISK, str(packed_dir), str(small / "cache"), str(Path(__file__).parents[1])],
            capture_output=True, text=True, timeout=100,
        )  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["48"], (done.returncode, done.stderr[-2000:])


def test_fetch_spans_tile_the_file_merge_small_gaps_and_cut_long_runs() -> None:
    offsets = np.arange(0, 1000, 100)
    ends = offsets + 100
    present = ~np.array([1, 1, 0, 1, 0, 0, 0, 1, 1, 1], bool)

    def spans(present: np.ndarray, size: int = 1000, **kwargs: int) -> tuple[list, list]:
        fetched, kept = fetch_spans(offsets, ends, present, size, **kwargs)
        assert sorted(fetched + kept) == [r for r in sorted(fetched + kept) if r[0] < r[1]]  # no empty range
        tiles = sorted(fetched + kept)
        assert tiles[0][0] == 0 and tiles[-1][1] == size and all(a[1] == b[0] for a, b in zip(tiles, tiles[1:]))  # they tile the file
        return fetched, kept

    assert spans(present, gap=150, span=1000) == ([(0, 400), (700, 1000)], [(400, 700)])  # record 2 (100 bytes) is fetched again
    assert spans(present, gap=50, span=1000) == ([(0, 200), (300, 400), (700, 1000)], [(200, 300), (400, 700)])
    assert spans(present, gap=150, span=250) == ([(0, 200), (200, 400), (700, 900), (900, 1000)], [(400, 700)])  # cut at record starts
    assert spans(np.ones(10, bool)) == ([], [(0, 1000)])
    assert spans(np.zeros(10, bool), size=1050, span=1000) == ([(0, 900), (900, 1050)], [])  # bytes after the last record too
    assert spans(np.zeros(10, bool), span=50) == ([(k, k + 100) for k in range(0, 1000, 100)], [])  # a record larger than a span


# ---------------------------------------------------------------------------- the trainer


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_data_cache_under_two_torchrun_nodes_each_with_its_own_folder(s3_env: S3Server, remote_packed: str, tmp_path: Path) -> None:
    """``torchrun --nnodes 2 --nproc_per_node 2`` on one machine, ``data.path`` a URL and each node agent
    with its own ``data.cache``: the two ranks of a node share their folder, and each folder ends as
    the whole dataset."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    from proctree import quiet_env, torchrun_logs
    from train_cli import epochs_of, write_config

    config = write_config(tmp_path, tmp_path, workers=1, epochs=1, batch_size=4, validate=False)
    values = yaml.safe_load(config.read_text())
    values["data"]["path"] = remote_packed
    config.write_text(yaml.safe_dump(values))
    torchrun = Path(sys.executable).parent / "torchrun"
    port = free_port()
    agents = [
        subprocess.Popen(
            [
                str(torchrun),
                *torchrun_logs(tmp_path),
                "--nnodes",
                "2",
                "--nproc_per_node",
                "2",
                "--rdzv_backend",
                "c10d",
                "--rdzv_endpoint",
                f"127.0.0.1:{port}",
                "--rdzv_id",
                "imgpipe-cache-2nodes",
                "-m",
                "imgpipe",
                "train",
                "--config",
                str(config),
                "--gpus",
                "0",
                "--set",
                f"data.cache={tmp_path / f'node{node}'}",
            ],
            env=quiet_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for node in range(2)
    ]
    outs = [agent.communicate(timeout=500) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(err[-2000:] for _, err in outs)
    assert "".join(out for out, _ in outs).count("done: 1 epoch(s), 3 steps") == 1  # 48 records / G 16
    assert [r["rank"] for r in epochs_of(tmp_path / "run")[0]["ranks"]] == [0, 1, 2, 3]
    for node in range(2):  # filled by the node's ranks while they trained
        assert (tmp_path / f"node{node}" / "manifest.json").is_file()
        _verify(tmp_path / f"node{node}")
