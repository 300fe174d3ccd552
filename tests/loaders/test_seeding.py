"""Derived seeds: pure, reproducible, and distinct for every (seed, epoch, index) and (seed, epoch, rank, worker)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from imgpipe.loaders.seeding import order_rng, sample_rng, seed_worker_globals, worker_seed


def _head(rng) -> tuple[int, int]:
    return int(rng.integers(0, 2**63)), int(rng.integers(0, 2**63))


def test_sample_streams_are_reproducible_and_pure() -> None:
    assert _head(sample_rng(3, 1, 17)) == _head(sample_rng(3, 1, 17))
    assert _head(sample_rng(3, 1, 17)) == _head(sample_rng(np.int64(3), np.int32(1), np.uint64(17)))


def test_no_two_samples_epochs_or_seeds_share_a_stream() -> None:
    heads = [_head(sample_rng(seed, epoch, index)) for seed in (0, 1) for epoch in range(3) for index in range(300)]
    assert len(set(heads)) == len(heads)


def test_streams_do_not_collide_across_families() -> None:
    # (seed, epoch, index) == (0, 0, 0) in every family, yet all streams differ.
    heads = {_head(sample_rng(0, 0, 0)), _head(order_rng(0, 0)), _head(np.random.default_rng(worker_seed(0, 0, 0, 0)))}
    assert len(heads) == 3
    # a swapped tuple is a different stream: (seed=1, epoch=2) vs (seed=2, epoch=1)
    assert _head(sample_rng(1, 2, 3)) != _head(sample_rng(2, 1, 3))


def test_worker_seeds_are_distinct_and_64_bit() -> None:
    seeds = [worker_seed(7, epoch, rank, worker) for epoch in range(3) for rank in range(8) for worker in range(8)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**64 for s in seeds)
    assert max(seeds) >= 2**32  # uses the full width, not a 32-bit seed


def test_seed_worker_globals_seeds_random_numpy_and_torch() -> None:
    def draw() -> tuple[float, int, float]:
        return random.random(), int(np.random.randint(0, 2**31)), float(torch.rand(1))

    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        seed_worker_globals(0, 1, 2, 3)
        first = draw()
        seed_worker_globals(0, 1, 2, 3)
        assert draw() == first
        seed_worker_globals(0, 1, 2, 4)
        other = draw()
        assert all(a != b for a, b in zip(first, other))
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])


def test_negative_values_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        sample_rng(-1, 0, 0)
    with pytest.raises(ValueError, match="must be >= 0"):
        worker_seed(0, 0, -1, 0)


def test_sample_streams_draw_uniformly_and_keep_going_past_one_digest() -> None:
    rng = sample_rng(0, 0, 0)
    words = [rng.word() for _ in range(20)]  # 8 words a digest: three digests
    assert len(set(words)) == 20 and all(0 <= w < 2**64 for w in words)
    units = np.array([sample_rng(1, 2, i).random() for i in range(20000)])
    assert units.min() >= 0 and units.max() < 1 and abs(units.mean() - 0.5) < 0.01
    assert np.histogram(units, bins=10, range=(0, 1))[0].min() > 1800  # flat: ~2000 per tenth
    faces = np.bincount([sample_rng(3, 0, i).integers(1, 7) for i in range(6000)], minlength=8)
    assert faces[0] == faces[7] == 0 and faces[1:7].min() > 900  # 1..6 only, each ~1000 times
    assert all(2.0 <= sample_rng(0, 1, i).uniform(2.0, 3.5) < 3.5 for i in range(1000))
