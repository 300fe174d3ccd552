"""Exact validation: every record of the val split once across the ranks, loss and top-1/top-k all-reduced.

A count that differs from the split's record count stops the run (its accuracy would not be the
split's). With ``data.val_flip_tta`` each image's logits are the mean of its own and its mirror's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from imgpipe.errors import TrainError
from imgpipe.train.precision import autocast

if TYPE_CHECKING:
    from imgpipe.train.config import TrainConfig
    from imgpipe.train.data import TrainData
    from imgpipe.train.rank import RankContext


def validate(
    module: torch.nn.Module,
    prefix: str,
    *,
    data: TrainData,
    config: TrainConfig,
    ctx: RankContext,
    epoch: int,
    autocast_dtype: torch.dtype | None,
    criterion: torch.nn.Module,
    topk: int,
) -> dict[str, Any]:
    """``module`` over the val split: ``{prefix}_samples``, ``_loss``, ``_top1`` and ``_top{topk}``, the same on every rank."""
    broadcast_buffers(module, ctx)
    training = module.training
    module.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=ctx.device)
    data.val.set_epoch(epoch)
    with torch.no_grad():
        for images, labels in data.val:
            with autocast(ctx.device, autocast_dtype):
                output = val_logits(module, images, config.data.val_flip_tta)
                loss = criterion(output.float(), labels)
            accumulate(totals, loss, output, labels, topk)
    if ctx.distributed:
        dist.all_reduce(totals)
    module.train(training)
    loss_sum, top1, topk_hits, samples = totals.tolist()
    samples = int(samples)
    if samples != data.val_records:  # every rank has the all-reduced count: all stop together
        raise TrainError(
            f"validation saw {samples} samples but split {config.data.val_split!r} of {config.data.path} has "
            f"{data.val_records} records, so its accuracy is not that of the split; run 'imgpipe verify {config.data.path}' "
            "and report it as an imgpipe bug if the data is intact"
        )
    return {
        f"{prefix}_samples": samples,
        f"{prefix}_loss": loss_sum / max(samples, 1),
        f"{prefix}_top1": top1 / max(samples, 1),
        f"{prefix}_top{topk}": topk_hits / max(samples, 1),
    }


def val_logits(module: torch.nn.Module, images: torch.Tensor, flip_tta: bool) -> torch.Tensor:
    """The validation logits: ``module``'s, or with ``flip_tta`` the mean of the image's and its mirror's (FFCV's lr_tta)."""
    output = module(images)
    return (output + module(images.flip(3))) / 2 if flip_tta else output


def accumulate(totals: torch.Tensor, loss: torch.Tensor, output: torch.Tensor, labels: torch.Tensor, k: int) -> None:
    """Add a batch's [loss sum, top-1 hits, top-k hits, samples] to ``totals``, on the device (no host sync)."""
    hits = output.topk(k, dim=1).indices.eq(labels.view(-1, 1))
    n = labels.shape[0]
    totals[:3] += torch.stack([loss.double() * n, hits[:, 0].sum().double(), hits.any(dim=1).sum().double()])
    totals[3] += n


def broadcast_buffers(module: torch.nn.Module, ctx: RankContext) -> None:
    """Give every rank rank 0's BatchNorm statistics, so validation is the same model everywhere."""
    if ctx.distributed:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)
