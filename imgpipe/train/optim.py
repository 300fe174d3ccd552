"""The optimizer and its learning-rate schedule: SGD, lr scaled by the global batch, and the schedule's factor per step.

BatchNorm and bias parameters (one dimension) decay by ``optim.bn_weight_decay``, the others by
``optim.weight_decay``. On a resume the config's hyper-parameters are applied over the loaded state.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from imgpipe.train.config import TrainConfig

LINEAR_RAMP_START = 1e-4  # FFCV's get_cyclic_lr: the ramp starts at 1e-4 of the peak


def build_optimizer(model: torch.nn.Module, config: TrainConfig, global_batch: int) -> torch.optim.Optimizer:
    """SGD with lr = base_lr * global_batch / 256; BN and bias parameters (ndim <= 1) decay by optim.bn_weight_decay
    (0 by default, as FFCV's and timm's), the others by optim.weight_decay."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.optim.weight_decay},
        {"params": no_decay, "weight_decay": config.optim.bn_weight_decay},
    ]
    return torch.optim.SGD(
        groups,
        lr=config.optim.base_lr * global_batch / 256,
        momentum=config.optim.momentum,
        nesterov=config.optim.nesterov and config.optim.momentum > 0,
    )


def apply_optim_config(
    optimizer: torch.optim.Optimizer, scheduler: Any, config: TrainConfig, global_batch: int, lr_factor: Any, step: int
) -> None:
    """After loading a checkpoint's optimizer and scheduler: the config's hyper-parameters, at ``step`` of its schedule.

    Loading restores the saved lr, momentum and weight decay (and the scheduler its base lr), which
    would silently ignore a changed ``optim`` section or global batch; the momentum buffers stay.
    """
    lr = config.optim.base_lr * global_batch / 256
    decay, no_decay = optimizer.param_groups  # as build_optimizer makes them
    for group, weight_decay in ((decay, config.optim.weight_decay), (no_decay, config.optim.bn_weight_decay)):
        group.update(
            initial_lr=lr,
            lr=lr * lr_factor(step),
            weight_decay=weight_decay,
            momentum=config.optim.momentum,
            nesterov=config.optim.nesterov and config.optim.momentum > 0,
        )
    scheduler.load_state_dict({**scheduler.state_dict(), "base_lrs": [lr, lr], "last_epoch": step})


def lr_schedule(config: TrainConfig, steps_per_epoch: int) -> Callable[[int], float]:
    """Multiplier of the scaled lr at optimizer step s: linear warmup, then cosine to 0 or step decay; or
    linear_ramp, FFCV's cyclic schedule: from 1e-4 at step 0 linearly up to 1 at optim.lr_peak_epoch,
    then linearly down to 0 at the end of train.epochs (FFCV interpolates per epoch, then per step
    inside each epoch: the same line, its knots on whole epochs)."""
    warmup = int(round(config.optim.warmup * steps_per_epoch))
    total = max(1, config.train.epochs * steps_per_epoch)
    boundaries = [e * steps_per_epoch for e in config.optim.step_epochs]
    gamma, cosine = config.optim.step_gamma, config.optim.schedule == "cosine"
    peak = config.optim.lr_peak_epoch * steps_per_epoch

    def factor(step: int) -> float:
        if config.optim.schedule == "linear_ramp":
            return float(np.interp(step, [0, peak, total], [LINEAR_RAMP_START, 1.0, 0.0]))
        if step < warmup:
            return (step + 1) / warmup
        if cosine:
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return gamma ** sum(step >= b for b in boundaries)

    return factor
