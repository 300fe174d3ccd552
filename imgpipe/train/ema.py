"""``train.ema``: an exponential moving average of the weights, validated beside them.

After every optimizer step, each floating-point entry of the model's state (parameters and
BatchNorm running statistics) moves towards the live one: ``ema = decay * ema + (1 - decay) * live``;
other entries (BatchNorm's batch counters) are copied. timm's ``ModelEmaV3`` does the same.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class EmaWeights:
    """A frozen copy of ``model`` (``module``) whose state follows the model's as an EMA of ``decay`` per step."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.module = copy.deepcopy(model).eval()
        for param in self.module.parameters():
            param.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """One step of the average towards ``model``'s current state."""
        ours, live = [], []
        for mine, theirs in zip(self.module.state_dict().values(), model.state_dict().values()):
            if mine.is_floating_point():
                ours.append(mine)
                live.append(theirs)
            else:
                mine.copy_(theirs)
        if ours:
            torch._foreach_lerp_(ours, live, 1.0 - self.decay)

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)
