"""``train.mixup_alpha`` / ``train.cutmix_alpha``: mixup and cutmix drawn per sample from (seed, epoch, record).

Each sample is mixed with its neighbour in the epoch's global order (positions 2k and 2k + 1): a
function of (seed, e, i), in the same rank's batch whatever the world size when the per-rank batch is
even (docs/data-contract.md). The mode, lambda ~ Beta(alpha, alpha) and the cutmix box (timm's
``rand_bbox``) come from the sample's own ``SampleStream(MIX_DOMAIN, ...)``; the target is lambda of its
own label and 1 - lambda of its partner's, lambda being its own share of the pixels for cutmix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import torch

from imgpipe.errors import ConfigError
from imgpipe.loaders.seeding import SampleStream

MIX_DOMAIN = 0x4D495846  # "MIXF": a family of its own, never a crop's stream
CUTMIX_P = 0.5  # with both on: cutmix for a sample with this probability, else mixup


class SampleMix(NamedTuple):
    """One sample's draw: cutmix (with its box, rows top..bottom, columns left..right) or mixup, and lambda,
    the share of the sample's own image (for cutmix: of its pixels, after clipping the box)."""

    cutmix: bool
    lam: float
    box: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right


def beta(alpha: float, stream: SampleStream) -> float:
    """A draw of Beta(alpha, alpha), as X / (X + Y) of two Gamma(alpha) draws."""
    x, y = gamma(alpha, stream), gamma(alpha, stream)
    return x / (x + y) if x + y > 0 else 0.5


def gamma(alpha: float, stream: SampleStream) -> float:
    """A draw of Gamma(alpha, 1) by Marsaglia and Tsang's method (alpha < 1: boosted by U ** (1 / alpha))."""
    if alpha < 1:
        return gamma(alpha + 1, stream) * (1.0 - stream.random()) ** (1 / alpha)
    d = alpha - 1 / 3
    c = 1 / math.sqrt(9 * d)
    while True:
        x = normal(stream)
        v = (1 + c * x) ** 3
        if v <= 0:
            continue
        u = 1.0 - stream.random()  # in (0, 1]
        if u < 1 - 0.0331 * x**4 or math.log(u) < 0.5 * x * x + d * (1 - v + math.log(v)):
            return d * v


def normal(stream: SampleStream) -> float:
    """A standard normal draw (Box-Muller)."""
    radius = math.sqrt(-2.0 * math.log(1.0 - stream.random()))
    return radius * math.cos(2 * math.pi * stream.random())


@dataclass(frozen=True)
class Mixing:
    """The mixing of a run: its alphas and seed (a 0 alpha: that kind off)."""

    mixup_alpha: float
    cutmix_alpha: float
    seed: int

    @property
    def enabled(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    def draw(self, epoch: int, record: int, size: int) -> SampleMix:
        """What record ``record`` of ``epoch`` does, on a ``size`` x ``size`` image."""
        stream = SampleStream(MIX_DOMAIN, self.seed, epoch, record)
        cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or stream.random() < CUTMIX_P)
        lam = beta(self.cutmix_alpha if cutmix else self.mixup_alpha, stream)
        if not cutmix:
            return SampleMix(False, lam)
        cut = int(size * math.sqrt(1.0 - lam))
        cy, cx = stream.integers(0, size), stream.integers(0, size)
        top, bottom = max(cy - cut // 2, 0), min(cy + cut // 2, size)
        left, right = max(cx - cut // 2, 0), min(cx + cut // 2, size)
        return SampleMix(True, 1.0 - (bottom - top) * (right - left) / (size * size), (top, bottom, left, right))

    def apply(
        self, images: torch.Tensor, labels: torch.Tensor, records: Sequence[int], epoch: int, classes: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mixed images, soft targets) for a batch whose sample k is record ``records[k]``; the partner
        of sample k is sample k ^ 1."""
        count, size = images.shape[0], images.shape[-1]
        if count % 2:
            raise ConfigError(
                f"mixup/cutmix pair each sample with its neighbour: a batch of {count} cannot pair up; use an even per-rank batch"
            )
        draws = [self.draw(epoch, int(record), size) for record in records]
        partner = torch.arange(count, device=images.device) ^ 1
        lam = torch.tensor([d.lam for d in draws], dtype=torch.float32)
        own = torch.tensor([1.0 if d.cutmix else d.lam for d in draws], dtype=torch.float32).to(images.device, non_blocking=True)
        shape = (count, 1, 1, 1)
        mixed = images * own.view(shape).to(images.dtype) + images[partner] * (1 - own).view(shape).to(images.dtype)
        if any(d.cutmix for d in draws):
            boxes = torch.tensor(np.array([d.box for d in draws], dtype=np.int64)).to(images.device, non_blocking=True)
            span = torch.arange(size, device=images.device)
            rows = (span >= boxes[:, 0:1]) & (span < boxes[:, 1:2])
            cols = (span >= boxes[:, 2:3]) & (span < boxes[:, 3:4])
            mixed = torch.where(rows[:, None, :, None] & cols[:, None, None, :], images[partner], mixed)
        lam = lam.to(images.device, non_blocking=True)
        onehot = torch.nn.functional.one_hot(labels, classes).float()
        targets = onehot * lam[:, None] + onehot[partner] * (1 - lam)[:, None]
        return mixed, targets
