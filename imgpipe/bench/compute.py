"""What a rank does with each batch: the trainer's model and training step, or a simulated one.

``--model NAME``: the model, optimizer, loss and precision ``imgpipe train`` builds for the bench's
trainer config, with the trainer's own functions: forward + backward (``step``), the gradient
all-reduce (``sync``), the optimizer step (``update``). The model is not wrapped in DDP, which would
all-reduce inside ``backward``, where it cannot be told apart from compute. ``--compute-ms T``: a sleep
of T ms (like a GPU kernel, it leaves the CPU to the loader), then an all-reduce of one number.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from imgpipe.bench.config import BenchConfig
    from imgpipe.train.config import TrainConfig


class Compute:
    """The work a rank does on each batch: the trainer's model, or a sleep of ``compute_ms``."""

    def __init__(self, config: BenchConfig, ctx: Any, classes: int) -> None:
        import torch

        self.ctx = ctx
        self.sleep_s = config.compute_ms / 1000.0
        self.model = None
        self.token = torch.zeros(1, device=ctx.device)
        if config.model:
            from imgpipe.train.models import build_model
            from imgpipe.train.optim import build_optimizer
            from imgpipe.train.precision import amp_setup

            train = config.train_config(device=ctx.device)
            alone = dataclasses.replace(ctx, backend=None)  # no DDP: see the module docstring
            self.model, _ = build_model(train, classes, alone)  # the name passed BenchConfig.check
            self.optimizer = build_optimizer(self.model, train, train.train.batch_size * ctx.world_size)
            self.dtype, self.scaler = amp_setup(train, ctx.device)
            self.loss = torch.nn.CrossEntropyLoss(label_smoothing=train.optim.label_smoothing)

    def step(self, images: Any, labels: Any) -> None:
        """Forward and backward (or the simulated compute)."""
        if self.model is None:
            if self.sleep_s:
                time.sleep(self.sleep_s)
            return
        from imgpipe.train.precision import autocast

        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.ctx.device, self.dtype):
            loss = self.loss(self.model(images), labels)
        self.scaler.scale(loss).backward()

    def sync(self) -> None:
        """All-reduce the gradients (or one number): where DDP makes the ranks wait for each other."""
        import torch
        import torch.distributed as dist

        if self.ctx.distributed:
            if self.model is None:
                dist.all_reduce(self.token)
            else:
                grads = [p.grad for p in self.model.parameters() if p.grad is not None]
                flat = torch.cat([g.flatten() for g in grads])
                dist.all_reduce(flat)

    def update(self) -> None:
        """The optimizer step (part of compute)."""
        if self.model is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()


@contextlib.contextmanager
def trainer_cudnn(train: TrainConfig, device: Any) -> Iterator[None]:
    """On a GPU, cudnn's autotuner as the trainer sets it (on unless ``train.deterministic``); restored on exit."""
    if getattr(device, "type", "cpu") != "cuda":
        yield
        return
    from torch.backends import cudnn

    before = cudnn.benchmark
    cudnn.benchmark = not train.train.deterministic
    try:
        yield
    finally:
        cudnn.benchmark = before
