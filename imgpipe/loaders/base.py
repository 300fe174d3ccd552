"""What every imgpipe loader offers, so the trainer and users can rely on it whichever backend runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol, runtime_checkable

import numpy as np
import torch

from imgpipe.distenv import DistEnv
from imgpipe.errors import ConfigError
from imgpipe.loaders.common import FULL_BATCH_FIX, no_full_batch
from imgpipe.loaders.options import check_int

if TYPE_CHECKING:
    from imgpipe.format.shardset import ShardSet
    from imgpipe.loaders.sampler import EpochSampler

CLOSED = "the loader was closed (loader.close()) and yields no more batches; make a new loader to iterate again"
SUPERSEDED = (
    "this iterator's pass over the loader ended when a later iter(loader) began: a loader runs one pass at a time; "
    "take batches from the newest iterator, or make a second loader for a second stream"
)
MOVED = (
    "this iterator's pass over the loader ended when the loader moved to rank {rank} of {world_size} (a process group "
    "appeared after the pass began); iterate the loader again for this rank's part of the stream"
)


@runtime_checkable
class Loader(Protocol):
    """An iterable of ``(images, labels)`` batches; each new ``iter()`` is the next epoch.

    ``state_dict`` is the position in the global stream (epoch, global batches yielded, seed,
    records, G, resolution); ``load_state_dict`` makes the next ``iter()`` yield exactly the batches an
    uninterrupted run would have yielded next, at any world size with the same G. ``set_resolution(px)``
    changes the output size from the next ``iter()`` on (the records, crop boxes and flips stay those of
    (seed, epoch, record)). ``skipped`` counts the corrupt records replaced so far; ``close`` stops any
    worker processes and threads now, and the loader yields nothing after it.
    """

    skipped: int

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def set_resolution(self, px: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class SampledLoader:
    """What both loaders share: passes over their ``EpochSampler`` one at a time, ``close``, this
    rank's place in the world, epoch, length, and the position in the global stream.

    One pass at a time: the position in the stream (``state_dict``) is one pass's, and a backend
    serves one pass (DALI's pipeline, the DataLoader's persistent workers). A pass begins at the
    first ``next()`` of an ``iter()``; it ends the pass before it, whose iterator then raises
    one ``ConfigError`` line if asked for another batch, instead of yielding another epoch's
    batches. An iterator dropped or left unread (Lightning's sanity check, a ``break``) is no
    obstacle to the next pass.

    The rank, when not given: a loader built before the process group exists (Lightning's
    ``trainer.fit(model, train_dataloaders=loader)`` with the loader built in ``__main__``) would
    otherwise read the whole stream on every rank. So each new pass, ``len()``, ``state_dict()``
    and ``load_state_dict()`` look again (``DistEnv.detect``: microseconds); when the rank, world
    size or ranks per node changed, the loader moves: a new sampler at the same position in
    the global stream, and the backend's workers set up for the new place (``_moved``).

    ``sampler`` and ``batch_sampler = None`` are also what PyTorch Lightning duck-types on a loader
    that is not a DataLoader: it then reads ``sampler`` to see that evaluation batches are not
    shuffled, calls ``sampler.set_epoch(e)`` with the epoch ``iter()`` would run anyway, and
    never injects a sampler of its own.
    """

    shards: ShardSet
    batch_sampler = None  # the batches come from ``sampler``; Lightning reads this attribute
    _live: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None  # the batches of the pass in progress
    _why_ended = ""  # what ended the last pass that ended early, for its iterator's error
    _closed = False

    def __init__(self, sampler: EpochSampler, env: DistEnv, *, follow_world: bool) -> None:
        self.sampler = sampler
        self.env = env  # this rank's place, as the sampler and the workers were set up for it
        self._follow_world = follow_world  # False when rank and world_size were given

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # a generator: the epoch begins at the first next(), so an iter() that is never read
        # (Lightning's iterability check) does not use up an epoch
        if self._closed:
            raise ConfigError(CLOSED)
        self._find_place()
        self._end_pass(SUPERSEDED)
        batches = self._batches(*self.sampler.begin_epoch())
        self._live = batches
        try:
            for batch in batches:
                yield batch
                if self._live is not batches:  # one check per batch: closed, moved, or a later pass began
                    raise ConfigError(self._why_ended)
        finally:
            if self._live is batches:
                self._live = None

    def _batches(self, epoch: int, batches: list[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The backend's batches for these record ``batches`` of ``epoch`` (each marked consumed as it is handed over)."""
        raise NotImplementedError

    def _end_pass(self, why: str) -> None:
        """End the pass in progress, if any (its iterator will raise ``why``): its generator lets go
        of what it holds (a pipeline, a DataLoader iterator)."""
        live, self._live = self._live, None
        if live is not None:
            self._why_ended = why
            try:
                live.close()
            except ValueError:  # being iterated in another thread right now: it stops at its next batch
                pass

    def close(self) -> None:
        """Stop the worker processes and threads now; iterating the loader afterwards is a ``ConfigError``."""
        self._closed = True
        self._end_pass(CLOSED)
        self._shut_down()

    def _shut_down(self) -> None:
        """The backend's part of ``close``."""
        raise NotImplementedError

    def _find_place(self) -> None:
        """Move to this process's current place in the world if it changed since the loader was set up."""
        if not self._follow_world or self._closed:
            return
        env = DistEnv.detect()
        if (env.rank, env.world_size, env.local_world_size) == (self.env.rank, self.env.world_size, self.env.local_world_size):
            return
        sampler = self.sampler.moved(env.rank, env.world_size)
        if sampler.train and len(sampler) == 0:
            raise no_full_batch(self.shards, self.shards.split, sampler.n, env.world_size, sampler.batch_size, FULL_BATCH_FIX)
        self._end_pass(MOVED.format(rank=env.rank, world_size=env.world_size))
        self.sampler, self.env = sampler, env
        self._moved(env)

    def _moved(self, env: DistEnv) -> None:
        """The backend's part of a move to ``env``: set its workers up for the new place."""
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """The epoch being (or last) iterated."""
        return self.sampler.epoch

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    def __len__(self) -> int:
        """This rank's number of batches per epoch, in the world as it is now (before a process group
        exists, this process's alone)."""
        self._find_place()
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run ``epoch``."""
        self.sampler.set_epoch(check_int("epoch", epoch, minimum=0))

    def set_resolution(self, px: int) -> None:
        """Make the next ``iter()`` yield ``px`` x ``px`` images: train crops keep their boxes and flips,
        resized to ``px``; evaluation center-crops ``px`` with the loader's crop ratio."""
        self.sampler.set_resolution(check_int("resolution", px, minimum=1))

    @property
    def resolution(self) -> int:
        """The output size of the pass being iterated, else of the next one."""
        return int(self.sampler.current_resolution)  # type: ignore[arg-type]  (the loaders always give one)

    @property
    def last_records(self) -> np.ndarray:
        """The record indices (positions in the split) of the batch yielded last, in batch order: what
        per-sample draws of the trainer (mixup, cutmix) key on, with the epoch."""
        return self.sampler.last_batch

    def state_dict(self) -> dict[str, Any]:
        """The position in the global stream (epoch, global batches yielded, seed, records, G) and the resolution, for a checkpoint."""
        self._find_place()
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``iter()`` yields exactly the batches an uninterrupted run would have yielded next.

        The state may come from either backend and any world size and worker count with the same global batch G.
        """
        self._find_place()
        self.sampler.load_state_dict(state)
