"""What a rank does with each batch: a torchvision model's training step, or a simulated one.

``--model NAME``: forward + backward (``step``), the gradient all-reduce (``sync``), the SGD
step (``update``). ``--compute-ms T``: a sleep of T ms (like a GPU kernel, it leaves the CPU
to the loader), then an all-reduce of one number, where DDP would make the ranks meet.
"""

from __future__ import annotations

import time
from typing import Any



class Compute:
    """The work a rank does on each batch: a torchvision model, or a sleep of ``compute_ms``."""

    def __init__(self, model: str | None, compute_ms: float, ctx: Any, classes: int) -> None:
        import torch

        self.ctx = ctx
        self.sleep_s = compute_ms / 1000.0
        self.model = None
        self.token = torch.zeros(1, device=ctx.device)
        if model:
            import torchvision

            self.model = torchvision.models.get_model(model, num_classes=classes).to(ctx.device)  # the name passed BenchConfig.check
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
            self.loss = torch.nn.CrossEntropyLoss()

    def step(self, images: Any, labels: Any) -> None:
        if self.model is None:
            if self.sleep_s:
                time.sleep(self.sleep_s)
            return
        self.optimizer.zero_grad(set_to_none=True)
        self.loss(self.model(images), labels).backward()

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
            self.optimizer.step()
