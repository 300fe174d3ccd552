"""The torch loader's shared-memory batch ring: the caller gets each batch without a copy, and a slot
is built in again only once the caller holds no tensor on it, so a batch kept never changes."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from imgpipe.errors import ConfigError  # noqa: E402
from imgpipe.loaders.ring import BatchRing, allocation_lock, check_shared_memory  # noqa: E402
from imgpipe.loaders.torch import make_torch_loader  # noqa: E402

SIZE = 24


def _loader(packed_dir: Path, **kw):
    kw.setdefault("batch_size", 4)
    return make_torch_loader(packed_dir, image_size=SIZE, rank=0, world_size=1, seed=2, **kw)


def _recording_claims(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    claims: list[int | None] = []
    claim = BatchRing.claim

    def recorded(self: BatchRing) -> int | None:
        claims.append(claim(self))
        return claims[-1]

    monkeypatch.setattr(BatchRing, "claim", recorded)
    return claims


def test_a_slot_is_claimed_again_only_once_back_and_no_longer_held() -> None:
    ring = BatchRing(3, batch_size=2, image_size=4, memory_format=torch.contiguous_format)
    assert [ring.claim(), ring.claim(), ring.claim()] == [0, 1, 2]
    assert ring.claim() is None  # all three in flight
    first = ring.receive(0, 2)  # back, and held by the caller
    assert ring.claim() is None
    second = ring.receive(1, 1)
    pixel_row = second[0, 1]  # a view of the batch keeps the slot as the batch does
    del second
    assert ring.claim() is None
    as_numpy = first.numpy()  # so does a numpy array on it
    del first
    assert ring.claim() is None
    del as_numpy
    assert ring.claim() == 0  # back and dropped: free
    del pixel_row
    assert ring.claim() == 1
    assert ring.claim() is None  # 0 and 1 claimed again, 2 still in flight
    ring.begin_pass()  # a new pass: nothing claimed before is in flight any more
    assert [ring.claim(), ring.claim(), ring.claim(), ring.claim()] == [2, 0, 1, None]


def test_a_storage_object_keeps_its_slot_and_a_raw_address_or_weak_reference_does_not() -> None:
    ring = BatchRing(2, batch_size=2, image_size=4, memory_format=torch.contiguous_format)
    assert [ring.claim(), ring.claim()] == [0, 1]
    batch = ring.receive(0, 2)
    storage = batch.untyped_storage()
    del batch
    assert ring.claim() is None  # the storage alone holds slot 0 (and 1 is in flight)
    del storage
    assert ring.claim() == 0
    batch = ring.receive(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated, and still what .storage() gives
        typed = batch.storage()
    address, weak = batch.data_ptr(), weakref.ref(batch)
    del batch
    assert ring.claim() is None  # so does the typed storage
    del typed
    assert weak() is None and address == ring.slots[1].data_ptr()
    assert ring.claim() == 1  # an address and a weak reference do not: copy a batch you keep that way


@pytest.mark.timeout(120)
def test_a_caller_keeping_only_storages_keeps_the_batches_pixels(packed_dir: Path) -> None:
    """More batches than slots, each dropped but for its storage: no batch is built over a storage still held."""
    kept = []
    for x, y in _loader(packed_dir, workers=1, prefetch_factor=1, normalize=False):  # a ring of 3 slots, 12 batches
        kept.append((x.untyped_storage(), x.storage_offset(), x.shape, x.stride(), y))
        del x
    reference = list(_loader(packed_dir, workers=0, normalize=False))
    assert len(kept) == len(reference) == 12
    for (storage, offset, shape, stride, y), (x0, y0) in zip(kept, reference):
        x = torch.empty(0, dtype=torch.uint8).set_(storage, offset, shape, stride)
        assert torch.equal(x, x0) and torch.equal(y, y0)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_the_slots_are_shared_memory_in_the_memory_format_asked(dtype: torch.dtype) -> None:
    ring = BatchRing(2, batch_size=3, image_size=4, memory_format=torch.channels_last, dtype=dtype)
    assert len(ring.slots) == 2
    for slot in ring.slots:
        assert slot.is_shared() and slot.is_contiguous(memory_format=torch.channels_last) and slot.dtype == dtype
    ring.batch(1, 2).fill_(7)
    assert int(ring.slots[1][:2].min()) == 7 and int(ring.slots[1][2].max()) == 0 == int(ring.slots[0].max())


def test_a_ring_larger_than_free_shared_memory_is_a_clear_error(tmp_path: Path) -> None:
    check_shared_memory(1024, 3, str(tmp_path))  # fits
    with pytest.raises(ConfigError, match=r"3 shared-memory batches need .* MiB but .* MiB free; enlarge it \(docker run --shm-size"):
        check_shared_memory(1 << 62, 3, str(tmp_path))
    check_shared_memory(1 << 62, 3, str(tmp_path / "missing"))  # no such tmpfs: nothing to check


@pytest.mark.timeout(120)
@pytest.mark.parametrize("normalize", [False, True])
def test_batches_kept_by_the_caller_never_change(packed_dir: Path, normalize: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    claims = _recording_claims(monkeypatch)
    # 1 worker x prefetch 1: a ring of 3 slots, while the caller keeps all 12 batches
    kept = list(_loader(packed_dir, workers=1, prefetch_factor=1, normalize=normalize))
    reference = list(_loader(packed_dir, workers=0, normalize=normalize))
    assert len(kept) == len(reference) == 12
    for (x, y), (x0, y0) in zip(kept, reference):
        assert torch.equal(x, x0) and torch.equal(y, y0)
    assert x.dtype == (torch.float32 if normalize else torch.uint8)
    assert len({x.data_ptr() for x, _ in kept}) == 12  # twelve batches, none built over another the caller holds
    assert claims[:3] == [0, 1, 2] and set(claims[3:]) == {None}  # once every slot is held, batches go without one


@pytest.mark.timeout(120)
@pytest.mark.parametrize("normalize", [False, True])
def test_a_loop_that_drops_each_batch_gets_every_one_from_the_ring_without_a_copy(
    packed_dir: Path, normalize: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = _recording_claims(monkeypatch)
    loader = _loader(packed_dir, workers=2, prefetch_factor=1, normalize=normalize)  # 2 in flight + 2: 4 slots
    slots = {slot.data_ptr() for slot in loader.dataset.ring.slots}
    reference = _loader(packed_dir, workers=0, normalize=normalize)
    for _epoch in range(2):
        for (x, y), (x0, y0) in zip(loader, reference, strict=True):
            assert x.data_ptr() in slots  # the slot itself: the workers normalized (or not) in place
            assert torch.equal(x, x0) and torch.equal(y, y0)
    assert None not in claims and len(claims) == 24
    loader.close()


@pytest.mark.timeout(120)
def test_an_abandoned_pass_leaves_the_next_one_exact(packed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    claims = _recording_claims(monkeypatch)
    loader = _loader(packed_dir, workers=2, normalize=False)
    for step, batch in enumerate(loader):  # noqa: B007  (epoch 0: leave after 2 of 12 batches, 4 requests in flight)
        if step == 1:
            break
    del batch
    epoch1 = [(x.clone(), y.clone()) for x, y in loader]
    reference = _loader(packed_dir, workers=0, normalize=False)
    reference.set_epoch(1)
    assert all(torch.equal(x, x0) and torch.equal(y, y0) for (x, y), (x0, y0) in zip(epoch1, reference, strict=True))
    assert None not in claims  # the abandoned requests did not keep their slots
    loader.close()


@pytest.mark.timeout(120)
def test_without_persistent_workers_there_is_no_ring(packed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    claims = _recording_claims(monkeypatch)
    loader = _loader(packed_dir, workers=1, persistent_workers=False, normalize=False)
    assert loader.dataset.ring is None
    batches = [x.numpy().copy() for _ in range(2) for x, _ in loader]
    reference = _loader(packed_dir, workers=0, normalize=False)
    assert all(np.array_equal(a, b) for a, b in zip(batches, [x.numpy() for _ in range(2) for x, _ in reference], strict=True))
    assert claims == []


def test_a_ring_larger_than_available_memory_is_a_clear_error(tmp_path: Path) -> None:
    available = 2048 * 1024  # what psutil would say on a machine with 2 MiB available
    check_shared_memory(1024, 3, str(tmp_path), available=available)  # fits
    with pytest.raises(ConfigError, match=r"3 shared-memory batches need 3 MiB but only 2 MiB of memory is available; lower batch_size"):
        check_shared_memory(3 << 20, 3, str(tmp_path), available=available)


RING_OVER_A_FILE_SIZE_LIMIT = """
import resource, signal, torch
from imgpipe.errors import ConfigError
from imgpipe.loaders.ring import BatchRing
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file grown past the limit fails with EFBIG instead of ending the process
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # torch cannot size a shared-memory file over 1 MiB
try:
    BatchRing(3, batch_size=64, image_size=128, memory_format=torch.contiguous_format, dtype=torch.float32)
except ConfigError as e:
    print(e)
"""


@pytest.mark.timeout(120)
def test_shared_memory_that_runs_out_while_allocating_is_a_clear_error() -> None:
    """The check passes, then torch fails to size a slot's shared-memory file (as when a second rank took the
    room meanwhile; here a file size limit): one ConfigError line with the ring's size and torch's reason."""
    run = subprocess.run([sys.executable, "-c", RING_OVER_A_FILE_SIZE_LIMIT], capture_output=True, text=True, timeout=100)
    assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]
    message = run.stdout.strip()
    assert re.fullmatch(
        r"the torch loader's 3 shared-memory batches need 36 MiB but /dev/shm ran out \(unable to .*: File too large \(27\)\); "
        r"enlarge it \(docker run --shm-size=\.\.\.\) or lower batch_size, workers or prefetch_factor",
        message,
    ), message


def test_rings_are_checked_and_allocated_one_at_a_time(tmp_path: Path) -> None:
    done = threading.Event()

    def second_rank() -> None:
        with allocation_lock(str(tmp_path)):
            done.set()

    with allocation_lock(str(tmp_path)):
        thread = threading.Thread(target=second_rank)
        thread.start()
        assert not done.wait(0.5)  # blocked while the first holds the lock
    assert done.wait(10)
    thread.join()
    with allocation_lock(str(tmp_path / "missing")):  # no folder for the lock file: no lock, no error
        pass


HUGE = 1_000_000  # px: a batch of 4 needs 11 TiB, more than any machine's memory or /dev/shm


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["workers=0", "workers=0, resolution saved", "workers, not persistent"])
def test_batches_built_without_a_ring_that_cannot_fit_are_one_line(packed_dir: Path, how: str) -> None:
    """Without a ring a batch is allocated as it is built, here or in a worker: too large for the memory
    (or /dev/shm) it is one ConfigError naming the size, not the allocator's traceback."""
    workers = {"workers": 1, "persistent_workers": False} if how.startswith("workers,") else {"workers": 0}
    if how.endswith("saved"):
        state = _loader(packed_dir, **workers).state_dict()
        loader = _loader(packed_dir, **workers)
        loader.load_state_dict({**state, "resolution": HUGE})
    else:
        loader = make_torch_loader(packed_dir, batch_size=4, image_size=HUGE, rank=0, world_size=1, **workers)
    where = "/dev/shm has .* MiB free" if how.startswith("workers,") else f"batches of 4 images of {HUGE} px need .* MiB but only"
    with pytest.raises(ConfigError, match=where):
        next(iter(loader))
