"""What every imgpipe loader offers, so the trainer and users can rely on it whichever backend runs."""

from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

import torch


@runtime_checkable
class Loader(Protocol):
    """An iterable of ``(images, labels)`` batches; each new ``iter()`` is the next epoch.

    ``state_dict`` is the epoch and the batches of it already yielded; ``load_state_dict``
    makes the next ``iter()`` yield exactly the batches an uninterrupted run would have
    yielded next. ``skipped`` counts the corrupt records replaced so far; ``close`` stops any
    worker processes now.
    """

    skipped: int

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...
