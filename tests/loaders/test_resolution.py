"""Resolution as part of the data contract: ``set_resolution`` between epochs (progressive resizing).

Record i of epoch e keeps its records, crop box and flip, from (seed, e, i) alone, whatever the
world size and backend; only the output size changes. The loader state records the size, so a
run resumed mid-ramp on another rank count goes on at the size it stopped at.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from _packs import INDEXED_RECORDS as RECORDS  # noqa: E402  (label = record index; no world size or batch size here divides it)

from imgpipe.errors import ConfigError  # noqa: E402
from imgpipe.format.shardset import open_shardset  # noqa: E402
from imgpipe.loaders.geometry import EvalGeometry, TrainGeometry, sample_crop  # noqa: E402
from imgpipe.loaders.pixels import decode_sample  # noqa: E402
from imgpipe.loaders.sampler import rank_indices  # noqa: E402
from imgpipe.loaders.torch import make_torch_loader  # noqa: E402
from tests.train.proctree import children as child_pids  # noqa: E402

G = 6  # the global batch: 6 per epoch
RAMP = (16, 24, 32)  # epoch -> output size
SEED = 3


def make(backend: str, path: Path, world: int, rank: int, **kw):
    kw = {"batch_size": G // world, "image_size": RAMP[0], "normalize": False, "rank": rank, "world_size": world, "seed": SEED, **kw}
    if backend == "dali":
        from imgpipe.loaders.dali import make_dali_loader

        return make_dali_loader(path, "train", workers=1, **kw)
    return make_torch_loader(path, "train", workers=rank % 2, **kw)


def ramp_images(backend: str, path: Path, world: int) -> dict[tuple[int, int], np.ndarray]:
    """(epoch, record) -> the uint8 image every rank of ``world`` yields through the ramp."""
    seen: dict[tuple[int, int], np.ndarray] = {}
    for rank in range(world):
        loader = make(backend, path, world, rank)
        for epoch, size in enumerate(RAMP):
            loader.set_resolution(size)
            assert loader.resolution == size
            for batch, (images, labels) in enumerate(loader):
                assert tuple(images.shape) == (G // world, 3, size, size)
                want = rank_indices(RECORDS, seed=SEED, epoch=epoch, rank=rank, world_size=world, batch_size=G // world)
                assert labels.tolist() == want.reshape(-1, G // world)[batch].tolist()  # the global stream's records
                assert loader.last_records.tolist() == labels.tolist()
                for image, record in zip(images.numpy(), labels.tolist()):
                    seen[(epoch, record)] = image.copy()
        loader.close()
    return seen


@pytest.mark.timeout(300)
def test_a_resolution_ramp_gives_the_same_records_boxes_and_sizes_at_world_sizes_1_2_3(indexed: Path, backend: str) -> None:
    by_world = {world: ramp_images(backend, indexed, world) for world in (1, 2, 3)}
    assert len(by_world[1]) == len(RAMP) * (RECORDS // G) * G
    for world in (2, 3):
        assert by_world[world].keys() == by_world[1].keys()
        for key, image in by_world[1].items():
            assert np.array_equal(by_world[world][key], image), (backend, world, key)


@pytest.mark.timeout(300)
@pytest.mark.dali
def test_both_backends_give_the_same_records_and_nearly_the_same_pixels_through_the_ramp(indexed: Path, require_dali: None) -> None:
    ours, theirs = ramp_images("torch", indexed, 2), ramp_images("dali", indexed, 2)
    assert ours.keys() == theirs.keys()
    for epoch, size in enumerate(RAMP):
        keys = [key for key in ours if key[0] == epoch]
        a = np.stack([ours[k] for k in keys]).astype(np.float32)
        b = np.stack([theirs[k] for k in keys]).astype(np.float32)
        difference, shifted = float(np.abs(a - b).mean()), float(np.abs(a - np.roll(b, 1, axis=-1)).mean())
        assert a.shape[-1] == size and difference < min(4.0, shifted / 3), (size, difference, shifted)  # the resize filters only


@pytest.mark.timeout(120)
def test_only_the_output_size_changes_with_the_resolution(indexed: Path) -> None:
    """Each image is its record's crop from (seed, epoch, record), resized to the epoch's size; the
    geometry of a train box never reads the size."""
    shards = open_shardset(indexed, "train")
    loader = make_torch_loader(indexed, batch_size=4, image_size=16, workers=1, normalize=False, rank=0, world_size=1, seed=SEED)
    for size in (16, 40, 24):
        loader.set_resolution(size)
        loader.set_epoch(1)
        images, labels = next(iter(loader))
        for image, record in zip(images, labels.tolist()):
            crop_for = lambda w, h, record=record: sample_crop(TrainGeometry(image_size=999), w, h, seed=SEED, epoch=1, index=record)  # noqa: E731
            assert torch.equal(image, decode_sample(shards.read(record)[1], crop_for, size))
    loader.close()
    rng_free = TrainGeometry(image_size=16), TrainGeometry(image_size=320)
    assert [sample_crop(g, 200, 150, seed=1, epoch=2, index=7) for g in rng_free][0] == sample_crop(
        rng_free[1], 200, 150, seed=1, epoch=2, index=7
    )


@pytest.mark.timeout(300)
def test_a_run_resumed_mid_ramp_on_another_rank_count_goes_on_at_its_size(indexed: Path, backend: str) -> None:
    """2 ranks: epoch 0 at 16 px, then 1 global batch of epoch 1 at 24 px; the state loads into 3 ranks
    built for 16 px, which yield the rest of epoch 1 at 24 px, as one uninterrupted rank does."""
    whole = []
    single = make(backend, indexed, 1, 0)
    for size in RAMP[:2]:
        single.set_resolution(size)
        whole += [(x.numpy().copy(), y.tolist()) for x, y in single]
    single.close()
    first = [make(backend, indexed, 2, rank) for rank in range(2)]
    for loader in first:
        list(loader)  # epoch 0 at 16 px
        loader.set_resolution(24)
    its = [iter(loader) for loader in first]
    for it in its:
        next(it)
    state = first[0].state_dict()
    assert (state["epoch"], state["batches"], state["resolution"]) == (1, 1, 24) and state == first[1].state_dict()
    for loader in first:
        loader.close()
    resumed = [make(backend, indexed, 3, rank) for rank in range(3)]
    for loader in resumed:
        assert loader.resolution == 16
        loader.load_state_dict(state)
        assert loader.resolution == 24
    per_rank = [[(x.numpy().copy(), y.tolist()) for x, y in loader] for loader in resumed]
    rest = [(np.concatenate([x for x, _ in step]), sum((y for _, y in step), [])) for step in zip(*per_rank)]
    done = RECORDS // G + 1  # epoch 0 and one global batch of epoch 1
    assert [x.shape[-1] for x, _ in rest] == [24] * (RECORDS // G - 1)
    assert [y for _, y in rest] == [y for _, y in whole[done:]]
    assert all(np.array_equal(x, w) for (x, _), (w, _) in zip(rest, whole[done:]))
    for loader in resumed:
        loader.close()


def test_the_state_records_the_resolution_and_a_bad_one_is_refused(indexed: Path) -> None:
    loader = make_torch_loader(indexed, batch_size=4, image_size=16, workers=0, rank=0, world_size=1)
    assert loader.state_dict()["resolution"] == 16
    loader.set_resolution(48)
    assert loader.state_dict()["resolution"] == 48 and loader.resolution == 48
    for bad in (0, 24.0, "32", True):
        with pytest.raises(ConfigError, match="resolution"):
            loader.set_resolution(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^cannot resume: the loader state's resolution must be >= 1, got -3$"):
        loader.load_state_dict({**loader.state_dict(), "resolution": -3})
    old = {k: v for k, v in loader.state_dict().items() if k != "resolution"}  # a state saved before resolutions: the size stays
    loader.load_state_dict(old)
    assert loader.resolution == 48


def test_eval_center_crops_with_the_crop_ratio_at_its_own_size(indexed: Path) -> None:
    shards = open_shardset(indexed, "train")
    for ratio in (0.875, 0.5):
        loader = make_torch_loader(
            indexed, batch_size=5, train=False, image_size=16, crop_ratio=ratio, workers=0, normalize=False, rank=0, world_size=1
        )
        loader.set_resolution(40)
        images, labels = next(iter(loader))
        for image, record in zip(images, labels.tolist()):
            want = decode_sample(shards.read(record)[1], EvalGeometry(image_size=40, crop_fraction=ratio).crop, 40)
            assert torch.equal(image, want)
    with pytest.raises(ConfigError, match="crop_ratio must be a number in"):
        make_torch_loader(indexed, batch_size=5, train=False, crop_ratio=1.5, workers=0, rank=0, world_size=1)


# ------------------------------------------------------------------------------------ the torch loader's ring


def shm_mappings(pid: int | str = "self") -> list[int]:
    """The size of each /dev/shm mapping of process ``pid`` (the ring's slots, torch's shared tensors)."""
    sizes = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if "/dev/shm/" in line:
                start, end = (int(v, 16) for v in line.split()[0].split("-"))
                sizes.append(end - start)
    return sizes


def shm_mapped_bytes(pid: int | str = "self") -> int:
    """Bytes of /dev/shm files mapped by process ``pid``."""
    return sum(shm_mappings(pid))


def children() -> set[int]:
    """This process's child processes (the loader's workers), by their parent pid: a thread of this process
    that ends meanwhile (its ``/proc/self/task/<tid>/children`` gone) loses none of them."""
    return set(child_pids(os.getpid()))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(180)
def test_a_larger_resolution_grows_the_ring_without_leaking_shared_memory(indexed: Path) -> None:
    """2 workers x prefetch 2 + 2 = 6 slots of 4 float32 images: 64 px -> 128 px -> 96 px. The old
    slots leave /dev/shm once the caller drops its batches, the old workers are gone, and a smaller
    size keeps the ring and the workers."""
    gc.collect()
    before, workers_before = shm_mapped_bytes(), children()
    slop = 256 << 10  # the labels tensors in flight, a page each
    loader = make_torch_loader(indexed, batch_size=4, image_size=64, workers=2, rank=0, world_size=1, seed=SEED)
    slot = lambda px: 4 * 3 * px * px * 4  # noqa: E731  (float32 bytes of one slot)
    list(loader)
    first_workers = children() - workers_before
    assert len(first_workers) == 2
    assert 6 * slot(64) <= shm_mapped_bytes() - before < 6 * slot(64) + slop
    kept = next(iter(loader))[0]  # a batch the caller keeps over the re-size
    loader.set_resolution(128)
    epoch = [x.shape[-1] for x, _ in loader]
    assert epoch == [128] * (RECORDS // 4) and loader.dataset.ring.image_size == 128
    assert not any(alive(pid) for pid in first_workers)
    second_workers = children() - workers_before
    assert len(second_workers) == 2
    held = shm_mapped_bytes() - before
    assert 6 * slot(128) + slot(64) <= held < 6 * slot(128) + slot(64) + slop  # the new ring, and the one old slot the caller holds
    assert kept.shape[-1] == 64 and float(kept.abs().sum()) > 0
    del kept
    gc.collect()
    loader.set_resolution(96)  # smaller: the same slots, the same workers
    assert [x.shape[-1] for x, _ in loader] == [96] * (RECORDS // 4)
    assert children() - workers_before == second_workers and loader.dataset.ring.image_size == 128
    assert 6 * slot(128) <= shm_mapped_bytes() - before < 6 * slot(128) + slop  # the 64 px slot is gone
    for pid in second_workers:  # the new ring, and of the old one only the slot the caller held when they were forked
        sizes = shm_mappings(pid)
        assert sizes.count(slot(64)) <= 1 and sizes.count(slot(128)) <= 6, sizes
    loader.close()
    del loader
    gc.collect()
    assert shm_mapped_bytes() - before < slop


@pytest.mark.timeout(180)
def test_max_image_size_allocates_the_ring_once_for_the_whole_ramp(indexed: Path) -> None:
    workers_before = children()
    loader = make_torch_loader(indexed, batch_size=4, image_size=16, max_image_size=32, workers=2, rank=0, world_size=1, seed=SEED)
    assert loader.dataset.ring.image_size == 32
    started = None
    for size in RAMP:
        loader.set_resolution(size)
        reference = make_torch_loader(indexed, batch_size=4, image_size=size, workers=0, rank=0, world_size=1, seed=SEED)
        reference.set_epoch(loader.sampler.state_dict()["epoch"])
        for (x, y), (x0, y0) in zip(loader, reference, strict=True):
            assert torch.equal(x, x0) and torch.equal(y, y0)
        started = started or children() - workers_before
        assert children() - workers_before == started  # no restart through the ramp
    loader.close()


@pytest.mark.timeout(120)
def test_a_loader_that_finds_its_rank_late_keeps_the_resolution_asked(indexed: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built before its world is known (Lightning's loaders in __main__), told 24 px in the middle of a pass at
    16 px, then moved to rank 1 of 2: the next pass (epoch 1, as after an abandoned pass) is at 24 px."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    kw = {"batch_size": 3, "image_size": 16, "normalize": False, "seed": SEED, "device": "cpu"}
    if backend == "dali":
        from imgpipe.loaders.dali import make_dali_loader

        loader = make_dali_loader(indexed, "train", workers=1, **kw)
    else:
        loader = make_torch_loader(indexed, "train", workers=1, **kw)
    first = iter(loader)
    assert next(first)[0].shape[-1] == 16
    loader.set_resolution(24)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    batches = [(x.shape[-1], y.tolist()) for x, y in loader]
    want = rank_indices(RECORDS, seed=SEED, epoch=1, rank=1, world_size=2, batch_size=3).reshape(-1, 3).tolist()
    assert loader.sampler.world_size == 2 and batches == [(24, w) for w in want]
    loader.close()
