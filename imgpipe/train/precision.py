"""``train.amp``, ``train.channels_last`` and ``train.compile`` set to ``auto``: what a run uses on its device.

On a CUDA GPU with native bf16 (compute capability 8.0 and later) auto is bf16 autocast, channels_last
(the usual recipe behind NVIDIA's ResNet-50 numbers) and torch.compile; elsewhere it is no autocast,
NCHW and no compile (on the CPU compiling a ResNet takes minutes of a short run). amp and
channels_last default to auto, compile to false; explicit values are kept. A resolved ``train.amp``
gives the forward pass its autocast dtype and the step its gradient scaler (enabled for fp16 only).
"""

from __future__ import annotations

import torch

from imgpipe.train.config import TrainConfig

NATIVE_BF16 = (8, 0)  # Ampere


def resolve_auto(config: TrainConfig, device: torch.device) -> TrainConfig:
    """A copy of ``config`` whose amp, channels_last and compile say what runs on ``device``."""
    train = config.train
    if "auto" not in (train.amp, train.channels_last, train.compile):
        return config
    fast = device.type == "cuda" and torch.cuda.get_device_capability(device) >= NATIVE_BF16
    amp = ("bf16" if fast else "none") if train.amp == "auto" else train.amp
    channels_last = fast if train.channels_last == "auto" else train.channels_last
    compile_ = fast if train.compile == "auto" else train.compile
    return config.model_copy(update={"train": train.model_copy(update={"amp": amp, "channels_last": channels_last, "compile": compile_})})


def describe(config: TrainConfig) -> str:
    """What a resolved config runs, in words: "amp bf16, channels_last"."""
    return f"amp {config.train.amp}, {'channels_last' if config.train.channels_last else 'NCHW'}"


def amp_setup(config: TrainConfig, device: torch.device) -> tuple[torch.dtype | None, torch.amp.GradScaler]:
    """A resolved train.amp as (the autocast dtype, None for fp32; the gradient scaler, enabled for fp16 only)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.train.amp)
    return dtype, torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)


def autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """The forward pass's autocast context: ``dtype`` on ``device``, off for None."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)
