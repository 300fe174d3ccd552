"""The model and what changes it: DDP, the optimizer and its LR schedule, the gradient scaler, the EMA.

A :class:`Stepper` runs one micro-batch's forward and backward (no gradient all-reduce before the
last micro-batch of a ``train.grad_accum`` step) and the optimizer step, and holds the parts of a
checkpoint that belong to the model and its optimizer.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import TYPE_CHECKING, Any

import torch

from imgpipe.train import checkpoint_file as ckpt
from imgpipe.train.compiling import compile_forward
from imgpipe.train.config import TrainConfig
from imgpipe.train.ema import EmaWeights
from imgpipe.train.models import build_model
from imgpipe.train.optim import apply_optim_config, build_optimizer, lr_schedule
from imgpipe.train.precision import amp_setup, autocast
from imgpipe.train.validation import accumulate

if TYPE_CHECKING:
    from imgpipe.train.rank import RankContext


class Stepper:
    """This rank's model (``model``; ``ddp`` to call it through), its optimizer, schedule, scaler and EMA."""

    def __init__(self, config: TrainConfig, ctx: RankContext, num_classes: int, steps_per_epoch: int) -> None:
        self.config, self.ctx = config, ctx
        self.accum = config.train.grad_accum
        self.global_batch = config.train.batch_size * ctx.world_size * self.accum
        self.model, self.ddp = build_model(config, num_classes, ctx)
        self.ema = EmaWeights(self.model, config.train.ema_decay) if config.train.ema else None
        self.forward = compile_forward(self.ddp) if config.train.compile else self.ddp
        self.optimizer = build_optimizer(self.model, config, self.global_batch)
        self.lr_factor = lr_schedule(config, steps_per_epoch)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        self.autocast_dtype, self.scaler = amp_setup(config, ctx.device)
        if (
            config.train.amp == "fp16"
        ):  # the scaler skips steps with inf gradients, the schedule still advances (run_scope scopes the filter)
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=config.optim.label_smoothing)
        self.topk = min(5, num_classes)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def forward_backward(
        self, images: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor, final: bool, totals: torch.Tensor
    ) -> torch.Tensor:
        """One micro-batch; ``targets`` are the labels, or the soft targets of mixup/cutmix (accuracy counts ``labels``)."""
        sync = contextlib.nullcontext() if final or not self.ctx.distributed else self.ddp.no_sync()
        with sync:
            with autocast(self.ctx.device, self.autocast_dtype):
                output = self.forward(images)
                loss = self.criterion(output, targets)
            self.scaler.scale(loss / self.accum).backward()
        with torch.no_grad():
            accumulate(totals, loss.detach(), output.detach(), labels, self.topk)
        return loss.detach()

    def optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's model, optimizer, scheduler, scaler and EMA entries."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
        }

    def load_model(self, saved: dict[str, Any], path: str | os.PathLike, num_classes: int) -> None:
        """The checkpoint's weights, or one ConfigError when it holds another model or class count."""
        ckpt.load_model_state(self.model, saved, path, self.config.model.name, num_classes)

    def load_training_state(self, saved: dict[str, Any], step: int) -> None:
        """The checkpoint's optimizer, scheduler, scaler and EMA, then the config's hyper-parameters at ``step``.

        A checkpoint without an EMA (the run had train.ema off) starts the EMA at the loaded weights.
        """
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        if self.ema is not None:
            self.ema.load_state_dict(saved["ema"] if saved.get("ema") is not None else self.model.state_dict())
        apply_optim_config(self.optimizer, self.scheduler, self.config, self.global_batch, self.lr_factor, step)
