"""Test and diagnostic hook: make one rank of a real training run fail the way real runs fail.

``IMGPIPE_TRAIN_FAULT_RANK<r>=KIND`` makes rank ``r``:

- ``hang``: stop in its second forward pass (sleep) and never reach the step's all-reduce;
- ``oom``: raise ``torch.OutOfMemoryError`` in its second forward pass, as CUDA does;
- ``illegal-address``: raise the error CUDA gives for an illegal memory access, there too;
- ``unused-parameter``: carry a parameter that no forward pass uses (set it on every rank:
  DDP refuses models that differ between ranks);
- ``short-val``: leave out its last validation batch.

The second forward pass, so that one whole step (and its collectives) ran first. It lets a test
(or a user who wants to see how imgpipe reports these failures) break one rank on purpose;
nothing else reads these variables.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable, Iterator

import torch

from imgpipe.errors import ConfigError

FAULT_ENV = "IMGPIPE_TRAIN_FAULT_RANK{rank}"
KINDS = ("hang", "oom", "illegal-address", "unused-parameter", "short-val")
ILLEGAL_ADDRESS_TEXT = "CUDA error: an illegal memory access was encountered"


def fault(rank: int, environ: Any = None) -> str | None:
    """The fault the hook asks of ``rank``, or None."""
    env = os.environ if environ is None else environ
    name = FAULT_ENV.format(rank=rank)
    kind = env.get(name) or None
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"{name}={kind!r}: must be one of {', '.join(KINDS)}")
    return kind


def install(model: torch.nn.Module, rank: int) -> None:
    """Give ``model`` this rank's fault, if the hook asks for one (before DDP wraps it)."""
    kind = fault(rank)
    if kind == "unused-parameter":
        model.add_module("imgpipe_unused", torch.nn.Linear(1, 1))
    elif kind in ("hang", "oom", "illegal-address"):
        calls = [0]

        def before_forward(_module: torch.nn.Module, _inputs: Any) -> None:
            calls[0] += 1
            if calls[0] < 2:
                return
            if kind == "hang":
                while True:
                    time.sleep(60)
            if kind == "oom":
                raise torch.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB (injected by " + FAULT_ENV.format(rank=rank) + ")"
                )
            raise RuntimeError(ILLEGAL_ADDRESS_TEXT)

        model.register_forward_pre_hook(before_forward)


def val_batches(batches: Iterable[Any], rank: int) -> Iterator[Any]:
    """``batches``, less the last one when the hook asks for ``short-val`` on ``rank``."""
    if fault(rank) != "short-val":
        yield from batches
        return
    previous = None
    for batch in batches:
        if previous is not None:
            yield previous
        previous = batch
