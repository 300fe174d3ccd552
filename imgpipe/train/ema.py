"""``train.ema``: an exponential moving average of the weights, validated beside them.

torch's ``AveragedModel`` with ``get_ema_multi_avg_fn`` keeps the average: after every optimizer
step each floating-point parameter and buffer (BatchNorm's running statistics) moves towards the
live one, ``ema = decay * ema + (1 - decay) * live``; integer buffers (BatchNorm's batch counters)
are copied, not averaged. The average starts from the model as it is when the EMA is made.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


class EmaWeights:
    """A frozen copy of ``model`` (``module``) whose state follows the model's as an EMA of ``decay`` per step.

    ``state_dict`` is the copy's own (the model's keys), as checkpoints have always held it.
    """

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self._averaged = AveragedModel(model, multi_avg_fn=_ema_copying_counters(decay), use_buffers=True)
        self._averaged.update_parameters(model)  # the first update copies: the average starts at the model, not after a step
        self.module = self._averaged.module.eval()
        for param in self.module.parameters():
            param.requires_grad_(False)

    def update(self, model: torch.nn.Module) -> None:
        """One step of the average towards ``model``'s current state."""
        self._averaged.update_parameters(model)

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)


def _ema_copying_counters(decay: float) -> Any:
    """``get_ema_multi_avg_fn(decay)`` for floating-point tensors; a copy for the others.

    AveragedModel groups the tensors by dtype, so each call holds floats only or integers only;
    torch's EMA would scale an integer counter by ``decay`` and truncate it.
    """
    ema = get_ema_multi_avg_fn(decay)

    @torch.no_grad()
    def average(averaged: list[torch.Tensor], current: list[torch.Tensor], n_averaged: torch.Tensor) -> None:
        if averaged[0].is_floating_point():
            ema(averaged, current, n_averaged)
        else:
            for mine, theirs in zip(averaged, current):
                mine.copy_(theirs)

    return average
