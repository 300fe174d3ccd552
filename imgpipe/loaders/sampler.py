"""Which records this rank reads in an epoch, batch by batch: a pure function plus a small stateful sampler.

It implements docs/data-contract.md: one global stream (the epoch's order from (seed, epoch); global
batch b is the order's records ``[b*G, (b+1)*G)``, rank r taking the r-th slice), the same number of
full batches on every rank for training (``remainder``), every record exactly once in evaluation, a
state that is a position in the stream, and block-wise shuffle. Rule: the records of one step never
depend on the world size.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from imgpipe.distenv import DistEnv
from imgpipe.errors import ConfigError
from imgpipe.loaders.options import REMAINDER_POLICIES, check_int
from imgpipe.loaders.seeding import order_rng


def epoch_order(
    n: int, seed: int, epoch: int, *, shuffle: bool = True, block_size: int | None = None, window: int | None = None
) -> np.ndarray:
    """The order of all ``n`` records in ``epoch``, identical on every rank (int64)."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = order_rng(seed, epoch)
    if not block_size or block_size <= 1:
        return rng.permutation(n).astype(np.int64)
    block_size = min(block_size, max(n, 1))  # a block beyond the split is the split (and 2**70 fits no int64)
    blocks = -(-n // block_size)
    order = (rng.permutation(blocks).astype(np.int64)[:, None] * block_size + np.arange(block_size, dtype=np.int64)).ravel()
    order = order[order < n]
    window = min(window or block_size, max(n, 1))
    if window > 1:
        keys = rng.random(n)
        order = order[np.lexsort((keys, np.arange(n) // window))]
    return order


def rank_indices(
    n: int,
    *,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    batch_size: int,
    train: bool = True,
    shuffle: bool | None = None,
    remainder: str = "drop",
    block_size: int | None = None,
    window: int | None = None,
) -> np.ndarray:
    """The record indices rank ``rank`` reads in ``epoch``, in order (int64). Pure function."""
    _check(n, rank, world_size, batch_size, remainder)
    shuffle = train if shuffle is None else shuffle
    order = epoch_order(n, seed, epoch, shuffle=shuffle, block_size=block_size, window=window)
    if not train:
        bounds = np.linspace(0, n, world_size + 1).round().astype(np.int64) if n else np.zeros(world_size + 1, np.int64)
        return order[bounds[rank] : bounds[rank + 1]]
    group = world_size * batch_size
    batches = n // group if remainder == "drop" else -(-n // group)
    if remainder == "drop" and batches == 0:
        raise ConfigError(
            f"{n} records cannot fill one batch of {batch_size} on each of {world_size} ranks; lower the batch size or use remainder='pad'"
        )
    if n and batches * group > n:
        order = np.resize(order, batches * group)
    # global batch b is order[b*G : (b+1)*G]; this rank's part of it is the r-th run of batch_size
    stream = order[: batches * group].reshape(batches, world_size, batch_size)
    return stream[:, rank].reshape(-1)


def batch_count(n: int, *, rank: int, world_size: int, batch_size: int, train: bool = True, remainder: str = "drop") -> int:
    """How many batches ``rank`` gets per epoch (the same for every epoch)."""
    _check(n, rank, world_size, batch_size, remainder)
    if train:
        group = world_size * batch_size
        return n // group if remainder == "drop" else -(-n // group)
    bounds = np.linspace(0, n, world_size + 1).round().astype(np.int64)
    return -(-int(bounds[rank + 1] - bounds[rank]) // batch_size)


def _check(n: int, rank: int, world_size: int, batch_size: int, remainder: str) -> None:
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if remainder not in REMAINDER_POLICIES:
        raise ConfigError(f"remainder must be one of {REMAINDER_POLICIES}, got {remainder!r}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")
    if n < 0:
        raise ConfigError(f"record count must be >= 0, got {n}")


class EpochSampler:
    """Yields this rank's batches of record indices; each new ``iter()`` is the next epoch.

    ``set_epoch(e)`` makes the next ``iter()`` epoch ``e`` (then it advances from there).
    ``set_resolution(px)`` makes the next epoch's output size ``px`` (the loaders resize to it).
    ``state_dict()`` holds the epoch, the batches already consumed and the resolution; after
    ``load_state_dict()`` the next ``iter()`` yields exactly the remaining batches, at that size.
    Rank and world size come from the arguments, else ``DistEnv.detect()``.
    """

    def __init__(
        self,
        n: int,
        *,
        batch_size: int,
        train: bool = True,
        shuffle: bool | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        remainder: str = "drop",
        block_size: int | None = None,
        window: int | None = None,
        resolution: int | None = None,
    ) -> None:
        env = DistEnv.detect(rank, world_size)
        self.n = int(n)
        self.batch_size = int(batch_size)
        self.train = train
        self.shuffle = train if shuffle is None else shuffle
        self.seed = int(seed)
        self.rank, self.world_size = env.rank, env.world_size
        self.remainder = remainder
        self.block_size = block_size
        self.window = window
        _check(self.n, self.rank, self.world_size, self.batch_size, remainder)
        self.epoch = 0  # the epoch being (or last) iterated
        self._next_epoch = 0
        self._resume_batches = 0
        self._consumed = 0
        self._active = False
        self.resolution = resolution  # the output size of the epoch being (or last) iterated
        self._next_resolution = resolution
        self._batches: list[np.ndarray] = []  # the batches begin_epoch handed out, from batch _first on
        self._first = 0

    def moved(self, rank: int, world_size: int) -> EpochSampler:
        """This sampler for rank ``rank`` of ``world_size``, at the same position in the global stream:
        the epoch the next ``iter()`` runs, and the records a resume would skip (a ``ConfigError``
        when they are not a whole number of the new global batches, or when they are an evaluation
        pass's). A pass under way ends with the move, as an abandoned pass does: the next is the next epoch."""
        moved = EpochSampler(
            self.n,
            batch_size=self.batch_size,
            train=self.train,
            shuffle=self.shuffle,
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            remainder=self.remainder,
            block_size=self.block_size,
            window=self.window,
            resolution=self._next_resolution,
        )
        epoch, batches = self._next_epoch, 0 if self._active else self._resume_batches
        records = batches * self.global_batch
        if records % moved.global_batch or (records and not self.train):
            raise ConfigError(
                f"cannot move the loader to rank {rank} of {world_size} in the middle of epoch {epoch} "
                f"({batches} global batches of {self.global_batch} done): give rank= and world_size= when "
                "building it, or build it once the process group exists"
            )
        moved.epoch = self.epoch
        moved.load_state_dict(
            {
                **self.state_dict(),
                "epoch": epoch,
                "batches": records // moved.global_batch,
                "global_batch": moved.global_batch,
                "world_size": world_size,
                "resolution": self._next_resolution,
            }
        )
        return moved

    def __len__(self) -> int:
        return batch_count(
            self.n, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size, train=self.train, remainder=self.remainder
        )

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run ``epoch``: from its start, or from the position ``load_state_dict``
        restored in that same epoch (the usual ``set_epoch(e)`` before each epoch, Lightning's included,
        must not undo a resume)."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        resumed = self._resume_batches if int(epoch) == self._next_epoch and not self._active else 0
        self._next_epoch, self._resume_batches, self._active = int(epoch), resumed, False

    def set_resolution(self, px: int) -> None:
        """Make the next ``iter()`` (or the epoch a loaded state resumes) yield ``px`` x ``px`` images."""
        if px < 1:
            raise ConfigError(f"resolution must be >= 1 pixel, got {px}")
        self._next_resolution = int(px)

    @property
    def current_resolution(self) -> int | None:
        """The output size of the epoch being iterated, else the one the next ``iter()`` will use (as ``state_dict`` records it)."""
        return self.resolution if self._active else self._next_resolution

    def indices(self, epoch: int) -> np.ndarray:
        """All of this rank's record indices for ``epoch``."""
        return rank_indices(
            self.n,
            seed=self.seed,
            epoch=epoch,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=self.batch_size,
            train=self.train,
            shuffle=self.shuffle,
            remainder=self.remainder,
            block_size=self.block_size,
            window=self.window,
        )

    def batches(self, epoch: int, start: int = 0) -> list[np.ndarray]:
        """This rank's batches of ``epoch`` from batch number ``start`` on."""
        idx = self.indices(epoch)
        return [idx[i : i + self.batch_size] for i in range(start * self.batch_size, len(idx), self.batch_size)]

    def begin_epoch(self) -> tuple[int, list[np.ndarray]]:
        """Start the next epoch: returns (epoch, the batches still to yield) and advances the counter."""
        epoch, start = self._next_epoch, self._resume_batches
        self.epoch, self._next_epoch, self._resume_batches = epoch, epoch + 1, 0
        self._consumed, self._active = start, True
        self.resolution = self._next_resolution
        self._batches, self._first = self.batches(epoch, start), start
        return epoch, self._batches

    def mark_consumed(self) -> None:
        """Count one batch of the current epoch as delivered to the user."""
        self._consumed += 1
        if self._consumed >= len(self):
            self._active = False

    @property
    def last_batch(self) -> np.ndarray:
        """The record indices of the batch delivered last (``mark_consumed``), in batch order."""
        position = self._consumed - self._first - 1
        if not 0 <= position < len(self._batches):
            raise ConfigError("no batch of this epoch has been delivered yet")
        return self._batches[position]

    def __iter__(self) -> Iterator[np.ndarray]:
        _, batches = self.begin_epoch()
        for batch in batches:
            self.mark_consumed()
            yield batch

    @property
    def global_batch(self) -> int:
        """G: the records of one step over all ranks (batch_size x world_size)."""
        return self.batch_size * self.world_size

    def state_dict(self) -> dict[str, Any]:
        """The position in the global stream: the epoch to run and its global batches already consumed.

        ``world_size`` and ``batch_size`` are recorded for messages only: the state loads into any
        sampler with the same seed, records and ``global_batch``.
        """
        if self._active:
            epoch, consumed = self.epoch, self._consumed
        else:
            epoch, consumed = self._next_epoch, self._resume_batches
        resolution = self.current_resolution
        state = {
            "epoch": epoch,
            "batches": consumed,
            "seed": self.seed,
            "records": self.n,
            "global_batch": self.global_batch,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
        }
        if resolution is not None:
            state["resolution"] = resolution
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``iter()`` yields the batches after ``state['batches']`` global batches of ``state['epoch']``."""
        counts = _read_state(state)
        if "seed" in counts and counts["seed"] != self.seed:
            raise ConfigError(
                f"cannot resume: the saved loader state is a position in the record order of seed={counts['seed']}, but this loader "
                f"has seed={self.seed}; make the loader with seed={counts['seed']} to resume (another seed is another order)"
            )
        if "records" in counts and counts["records"] != self.n:
            raise ConfigError(
                f"cannot resume: the saved loader state is a position in a split of {counts['records']} records, but this loader "
                f"reads {self.n}; load it into a loader over the split it was saved from"
            )
        saved_world = counts.get("world_size", self.world_size)
        saved_global = counts.get("global_batch", counts.get("batch_size", self.batch_size) * saved_world)
        if saved_global != self.global_batch:
            raise ConfigError(resume_mismatch(saved_global, self.batch_size, self.world_size))
        if not self.train and saved_world != self.world_size:
            raise ConfigError(f"cannot resume: an evaluation state saved on {saved_world} ranks does not carry over to {self.world_size}")
        epoch, consumed = counts["epoch"], counts["batches"]
        if consumed > len(self):
            raise ConfigError(f"cannot resume: epoch {epoch} batch {consumed} is outside this loader ({len(self)} batches per epoch)")
        if consumed == len(self):
            epoch, consumed = epoch + 1, 0
        self._next_epoch, self._resume_batches, self._active = epoch, consumed, False
        if "resolution" in counts:
            self._next_resolution = counts["resolution"]


STATE_COUNTS = {"epoch": 0, "batches": 0, "seed": 0, "records": 0, "global_batch": 1, "world_size": 1, "batch_size": 1, "resolution": 1}


def _read_state(state: object) -> dict[str, int]:
    """The counts of a loader state (``STATE_COUNTS``, each with its minimum), as ints. A state comes from a checkpoint,
    so anything else (a string, a bool, 2.5 or 2.0, a count below its minimum) is one ConfigError naming the key and the value.
    ``epoch`` and ``batches`` are required; the others may be absent (states saved before they were recorded), and
    ``resolution`` None."""
    if not isinstance(state, dict):
        raise ConfigError(f"cannot resume: a loader state is the dict loader.state_dict() returned, got {type(state).__name__}")
    if "epoch" not in state or "batches" not in state:
        raise ConfigError("cannot resume: the loader state needs integer 'epoch' and 'batches'")
    return {
        key: check_int(f"cannot resume: the loader state's {key}", state[key], minimum=minimum)
        for key, minimum in STATE_COUNTS.items()
        if key in state and not (key == "resolution" and state[key] is None)
    }


def batch_splits(global_batch: int) -> str:
    """Every (per-rank batch, world size) that makes ``global_batch``, as "12 on 1, 6 on 2, ... ranks"."""
    return ", ".join(f"{global_batch // w} on {w}" for w in range(1, global_batch + 1) if global_batch % w == 0) + " ranks"


def fitting_batch_sizes(global_batch: int, world_size: int) -> str:
    """The per-rank batch size that gives ``global_batch`` on ``world_size`` ranks, or the rank counts that can."""
    if global_batch % world_size == 0:
        return f"use batch_size {global_batch // world_size} on {world_size} ranks"
    return f"{global_batch} does not split over {world_size} ranks: use batch_size {batch_splits(global_batch)}"


def resume_mismatch(global_batch: int, batch_size: int, world_size: int) -> str:
    """One line: the saved global batch does not match batch_size x world_size, and what would."""
    return (
        f"cannot resume: the saved position is in a stream of global batch {global_batch}, but this loader has "
        f"batch_size {batch_size} x {world_size} ranks = {batch_size * world_size}; {fitting_batch_sizes(global_batch, world_size)}"
    )
