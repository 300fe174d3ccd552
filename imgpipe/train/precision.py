"""``train.amp`` and ``train.channels_last`` set to ``auto``: what a run uses on its device.

On a CUDA GPU with native bf16 (compute capability 8.0 and later) auto is bf16 autocast and
channels_last, the usual recipe behind NVIDIA's ResNet-50 numbers (about twice fp32 NCHW);
elsewhere (the CPU, older GPUs) it is no autocast and NCHW. Explicit values are kept.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from imgpipe.train.config import TrainConfig

NATIVE_BF16 = (8, 0)  # Ampere


def resolve_auto(config: TrainConfig, device: torch.device) -> TrainConfig:
    """A copy of ``config`` whose amp and channels_last say what runs on ``device``."""
    train = config.train
    if train.amp != "auto" and train.channels_last != "auto":
        return config
    fast = device.type == "cuda" and torch.cuda.get_device_capability(device) >= NATIVE_BF16
    amp = ("bf16" if fast else "none") if train.amp == "auto" else train.amp
    channels_last = fast if train.channels_last == "auto" else train.channels_last
    return replace(config, train=replace(train, amp=amp, channels_last=channels_last))


def describe(config: TrainConfig) -> str:
    """What a resolved config runs, in words: "amp bf16, channels_last"."""
    return f"amp {config.train.amp}, {'channels_last' if config.train.channels_last else 'NCHW'}"
