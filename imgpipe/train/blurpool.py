"""``model.blurpool``: an anti-aliasing blur before every strided convolution, as FFCV's ImageNet recipe does.

FFCV's ``train_imagenet.py`` (``BlurPoolConv2d``, ``apply_blurpool``): every ``Conv2d`` with a
stride above 1 and at least 16 input channels is wrapped so that its input first passes a
depthwise 3x3 binomial blur ([1, 2, 1] x [1, 2, 1] / 16, stride 1, zero padding 1). The stem
convolution (3 input channels) is left alone. The filter is a buffer, so it follows the model
to its device and memory format and is saved with the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_IN_CHANNELS = 16  # FFCV's rule: narrower strided convolutions (the stem) keep their input as is


class BlurPoolConv2d(torch.nn.Module):
    """``conv`` applied to its input blurred by a depthwise 3x3 binomial filter."""

    def __init__(self, conv: torch.nn.Conv2d) -> None:
        super().__init__()
        kernel = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16.0
        self.conv = conv
        self.register_buffer("blur_filter", kernel.expand(conv.in_channels, 1, 3, 3).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blurred = F.conv2d(x, self.blur_filter.to(x.dtype), stride=1, padding=1, groups=self.conv.in_channels)
        return self.conv(blurred)


def apply_blurpool(model: torch.nn.Module) -> int:
    """Wrap every strided ``Conv2d`` of ``model`` with at least ``MIN_IN_CHANNELS`` inputs in a
    :class:`BlurPoolConv2d`, in place; returns how many were wrapped."""
    wrapped = 0
    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.Conv2d) and max(child.stride) > 1 and child.in_channels >= MIN_IN_CHANNELS:
            setattr(model, name, BlurPoolConv2d(child))
            wrapped += 1
        else:
            wrapped += apply_blurpool(child)
    return wrapped
