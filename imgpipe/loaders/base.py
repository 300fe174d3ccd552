"""What every imgpipe loader offers, so the trainer and users can rely on it whichever backend runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol, runtime_checkable

import numpy as np
import torch

from imgpipe.errors import ConfigError
from imgpipe.loaders.common import check_int

if TYPE_CHECKING:
    from imgpipe.loaders.sampler import EpochSampler


@runtime_checkable
class Loader(Protocol):
    """An iterable of ``(images, labels)`` batches; each new ``iter()`` is the next epoch.

    ``state_dict`` is the position in the global stream (epoch, global batches yielded, seed,
    records, G, resolution); ``load_state_dict`` makes the next ``iter()`` yield exactly the batches an
    uninterrupted run would have yielded next, at any world size with the same G. ``set_resolution(px)``
    changes the output size from the next ``iter()`` on (the records, crop boxes and flips stay those of
    (seed, epoch, record)). ``skipped`` counts the corrupt records replaced so far; ``close`` stops any
    worker processes now.
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
    """The members both loaders take from their ``EpochSampler``: epoch, length, and the position in the global stream.

    ``sampler`` and ``batch_sampler = None`` are also what PyTorch Lightning duck-types on a loader
    that is not a DataLoader: it then reads ``sampler`` to see that evaluation batches are not
    shuffled, calls ``sampler.set_epoch(e)`` with the epoch ``iter()`` would run anyway, and
    never injects a sampler of its own.
    """

    sampler: EpochSampler
    batch_sampler = None  # the batches come from ``sampler``; Lightning reads this attribute

    @property
    def epoch(self) -> int:
        """The epoch being (or last) iterated."""
        return self.sampler.epoch

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    def __len__(self) -> int:
        """This rank's number of batches per epoch."""
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
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``iter()`` yields exactly the batches an uninterrupted run would have yielded next.

        The state may come from either backend and any world size and worker count with the same global batch G.
        """
        if not isinstance(state, dict):
            raise ConfigError(f"cannot resume: a loader state is the dict loader.state_dict() returned, got {type(state).__name__}")
        self.sampler.load_state_dict(state)
