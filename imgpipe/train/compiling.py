"""``train.compile``: the training forward through ``torch.compile``, one graph for every resolution.

A progressive-resizing run changes the image size between epochs. Compiled with static shapes,
each new size would be a new graph until dynamo's recompile limit, after which it silently runs
uncompiled; so the height and width of each batch are marked dynamic (``maybe_mark_dynamic``:
kept static where the model needs them to be), and the whole ramp runs one training graph.
Off by default; ``auto`` (``precision.resolve_auto``) compiles on a CUDA GPU with native bf16,
where inductor's kernels pay for the compile time, and not on the CPU, where compiling a ResNet takes minutes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from imgpipe._sys.torch_private import maybe_mark_dynamic

BACKEND = "inductor"


def compile_forward(module: torch.nn.Module, backend: Any = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s forward through ``torch.compile``, taking batches of any height and width without recompiling."""
    compiled = torch.compile(module, backend=backend or BACKEND)

    def forward(images: torch.Tensor) -> torch.Tensor:
        maybe_mark_dynamic(images, 2)
        maybe_mark_dynamic(images, 3)
        return compiled(images)

    return forward
