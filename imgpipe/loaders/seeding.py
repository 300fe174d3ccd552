"""Derived seeds: every random stream is a pure function of the user's seed and where it is used.

* ``sample_rng(seed, epoch, index)``: the augmentation stream of record ``index`` in ``epoch``.
  It depends on nothing else (not the worker, rank, batch position or world size), so a
  sample gets the same crop whatever the number of workers or ranks, and no two samples,
  epochs or seeds share a stream.
* ``order_rng(seed, epoch)``: the epoch permutation every rank computes identically.
* ``worker_seed(seed, epoch, rank, worker)``: the seed of the global ``random``, ``numpy``
  and ``torch`` generators of one DataLoader worker, for user code that reaches for them.

Each family mixes a distinct domain tag into ``numpy.random.SeedSequence``, whose hashing
makes streams from different tuples independent, so the families never collide either.
"""

from __future__ import annotations

import random

import numpy as np

_SAMPLE_DOMAIN = 0x53414D50  # "SAMP"
_ORDER_DOMAIN = 0x4F524452  # "ORDR"
_WORKER_DOMAIN = 0x574F524B  # "WORK"


def _entropy(*values: int) -> list[int]:
    for value in values:
        if int(value) < 0:
            raise ValueError(f"seeds, epochs, ranks and indices must be >= 0, got {value}")
    return [int(v) for v in values]


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random stream of record ``index`` (its position in the split) in ``epoch``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(_entropy(_SAMPLE_DOMAIN, seed, epoch, index))))


def order_rng(seed: int, epoch: int) -> np.random.Generator:
    """The stream that orders ``epoch``; identical on every rank."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(_entropy(_ORDER_DOMAIN, seed, epoch))))


def worker_seed(seed: int, epoch: int, rank: int, worker: int) -> int:
    """A 64-bit seed for the global generators of ``worker`` on ``rank`` in ``epoch``."""
    words = np.random.SeedSequence(_entropy(_WORKER_DOMAIN, seed, epoch, rank, worker)).generate_state(2, np.uint32)
    return int(words[0]) | (int(words[1]) << 32)


def seed_worker_globals(seed: int, epoch: int, rank: int, worker: int) -> int:
    """Seed ``random``, numpy's global generator and ``torch`` from (seed, epoch, rank, worker)."""
    import torch

    value = worker_seed(seed, epoch, rank, worker)
    random.seed(value)
    np.random.seed([value & 0xFFFFFFFF, value >> 32])
    torch.manual_seed(value & ((1 << 63) - 1))
    return value
