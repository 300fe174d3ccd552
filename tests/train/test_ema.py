"""train.ema: the EMA weights (torch's AveragedModel) follow the live ones as the hand-computed average, and are not the live ones."""

from __future__ import annotations

import torch

from imgpipe.train.ema import EmaWeights


def tiny_model() -> torch.nn.Module:
    """6x6 inputs."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 2)
    )


def test_after_k_steps_the_ema_is_the_hand_computed_average_and_differs_from_the_weights() -> None:
    model = tiny_model()
    decay, steps = 0.8, 5
    ema = EmaWeights(model, decay)
    expected = {k: v.clone().double() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(step))).square().mean().backward()
        optimizer.step()
        ema.update(model)
        for key, live in model.state_dict().items():
            if live.is_floating_point():
                expected[key] = decay * expected[key] + (1 - decay) * live.double()
            else:
                expected[key] = live.clone().double()
    got, live = ema.state_dict(), model.state_dict()
    for key in expected:
        torch.testing.assert_close(got[key].double(), expected[key], rtol=1e-5, atol=1e-6)
    assert got["1.num_batches_tracked"] == live["1.num_batches_tracked"] == steps  # counters are copied
    moved = [k for k in live if live[k].is_floating_point() and not torch.allclose(got[k], live[k], rtol=1e-4, atol=1e-5)]
    assert "0.weight" in moved and "1.running_mean" in moved and "4.weight" in moved  # the average lags the weights
    assert all(not p.requires_grad for p in ema.module.parameters()) and not ema.module.training
    assert list(got) == list(live)  # the model's own keys: checkpoints hold the EMA as they always have


def test_the_ema_loads_back_from_its_state() -> None:
    model = tiny_model()
    ema = EmaWeights(model, 0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)
    other = EmaWeights(tiny_model(), 0.5)
    other.load_state_dict(ema.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), ema.state_dict().values()))
