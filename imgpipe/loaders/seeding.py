"""Derived seeds: every random stream is a pure function of the user's seed and where it is used.

``sample_rng(seed, epoch, index)`` is record ``index``'s augmentation stream in ``epoch`` (a counter-based
``SampleStream``: word k is word k mod 8 of BLAKE2b(the tuple, k // 8)), the same whatever the worker,
rank, batch position or world size; ``order_rng(seed, epoch)`` is the epoch's permutation;
``worker_seed(seed, epoch, rank, worker)`` seeds one DataLoader worker's global ``random``, ``numpy`` and
``torch``. Each family mixes a domain tag of its own into what it hashes, so no two share a stream.
"""

from __future__ import annotations

import hashlib
import random
import struct

import numpy as np

_SAMPLE_DOMAIN = 0x53414D50  # "SAMP"
_ORDER_DOMAIN = 0x4F524452  # "ORDR"
_WORKER_DOMAIN = 0x574F524B  # "WORK"


def _entropy(*values: int) -> list[int]:
    for value in values:
        if int(value) < 0:
            raise ValueError(f"seeds, epochs, ranks and indices must be >= 0, got {value}")
    return [int(v) for v in values]


_WORDS = struct.Struct("<8Q")  # one BLAKE2b-512 digest: 8 words of 64 bits
_TO_UNIT = 1.0 / (1 << 53)


class SampleStream:
    """A counter-based stream of 64-bit words, with the few draws the geometry needs (numpy's names)."""

    __slots__ = ("_key", "_block", "_words", "_next")

    def __init__(self, *values: int) -> None:
        self._key = ",".join(str(v) for v in _entropy(*values)).encode() + b"/"
        self._block = 0
        self._words: tuple[int, ...] = ()
        self._next = 0

    def word(self) -> int:
        """The next 64-bit word."""
        if self._next == len(self._words):
            digest = hashlib.blake2b(self._key + str(self._block).encode(), digest_size=64).digest()
            self._words, self._block, self._next = _WORDS.unpack(digest), self._block + 1, 0
        self._next += 1
        return self._words[self._next - 1]

    def random(self) -> float:
        """A float in [0, 1), 53 bits."""
        return (self.word() >> 11) * _TO_UNIT

    def uniform(self, low: float, high: float) -> float:
        """A float in [low, high)."""
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int) -> int:
        """An int in [low, high) (bias below 2**-32 for ranges under 2**32)."""
        return low + ((self.word() * (high - low)) >> 64)


def sample_rng(seed: int, epoch: int, index: int) -> SampleStream:
    """The random stream of record ``index`` (its position in the split) in ``epoch``."""
    return SampleStream(_SAMPLE_DOMAIN, seed, epoch, index)


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
