"""train.compile: a resolution ramp runs one compiled training graph, not one per size (dynamo's own counter)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from imgpipe.train.compiling import compile_forward

SIZES = [16, 24, 32, 40, 48, 56, 64, 72, 80, 88]  # more sizes than dynamo's default recompile limit (8)


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )


@pytest.mark.timeout(120)
def test_every_resolution_of_a_ramp_runs_the_same_compiled_graph() -> None:
    torch._dynamo.reset()
    model, counter = net(), CompileCounter()
    forward = compile_forward(model, backend=counter)
    for size in SIZES:
        out = forward(torch.randn(4, 3, size, size))
        out.sum().backward()
        assert out.shape == (4, 4)
    assert counter.frame_count == 1, f"{counter.frame_count} compiles for {len(SIZES)} sizes"
    torch._dynamo.reset()


@pytest.mark.timeout(120)
def test_the_compiled_forward_computes_what_the_model_does() -> None:
    torch._dynamo.reset()
    model = net()
    forward = compile_forward(model, backend="eager")
    for size in (16, 40):
        x = torch.randn(2, 3, size, size)
        torch.testing.assert_close(forward(x), model(x))
    torch._dynamo.reset()
