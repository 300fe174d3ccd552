"""The bench's loaders: ``make_torch_loader`` / ``make_dali_loader`` as the trainer builds them, timed.

The torch loader is made inside :func:`~imgpipe.loaders.phase_timer.timing`, its hook for per-phase
times; everything else (workers, shared-memory ring, pinning, the copy one batch ahead on a side
stream, normalization on the device) is the loader users run. The phases (read, decode, collate, h2d,
compute, sync) and ``wait``, the data-wait the GPU sees, are defined in docs/bench-json.md.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

from imgpipe.loaders.phase_timer import PhaseTimer, timing

if TYPE_CHECKING:
    from imgpipe.train.config import TrainConfig


def make_loader(backend: str, train: TrainConfig, ctx: Any, timer: PhaseTimer | None) -> Any:
    """This rank's training loader of ``backend``, built with the arguments ``imgpipe.train`` gives it for
    ``train`` (``timer``: the torch loader's phase timer)."""
    from imgpipe.train.data import loader_kwargs

    kwargs = {**loader_kwargs(train, ctx), "image_size": train.data.image_size}
    path, split, batch_size = train.data.path, train.data.train_split, train.train.batch_size
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader

        with timing(timer) if timer is not None else contextlib.nullcontext():
            return make_torch_loader(path, split, batch_size=batch_size, train=True, prefetch_factor=train.data.prefetch_factor, **kwargs)
    from imgpipe.loaders.dali import make_dali_loader

    kwargs["workers"] = max(1, kwargs["workers"])  # DALI needs a thread (the bench always gives a count)
    return make_dali_loader(path, split, batch_size=batch_size, train=True, **kwargs)


def endless(loader: Any) -> Iterator[tuple[Any, Any]]:
    """``loader``'s batches, epoch after epoch."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1
