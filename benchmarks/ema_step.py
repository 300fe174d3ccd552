"""What ``train.ema`` costs per optimizer step on the CPU: torch's AveragedModel against the hand-written average it replaced.

The baseline is imgpipe's EMA before it moved to ``torch.optim.swa_utils`` (a ``_foreach_lerp_`` over
the state_dict's floating-point entries, the integer ones copied), kept here only to be measured
against. Both update the same model after each of the same real SGD steps (forward, backward, step
of a batch at a small size), in alternating rounds; printed: each round's median update time per
step, the medians over rounds, their ratio, and the update's share of the step it follows. The two
averages are also compared: they must agree to the last bit.

Usage::

    python benchmarks/ema_step.py                      # resnet18 and resnet50, 5 rounds of 20 steps, batch 8 at 64 px
    python benchmarks/ema_step.py --models resnet50 --rounds 9
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torchvision

from imgpipe.train.ema import EmaWeights


class HandWrittenEma:
    """imgpipe's EMA before torch's AveragedModel: the baseline."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.module = copy.deepcopy(model).eval()
        for param in self.module.parameters():
            param.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        ours, live = [], []
        for mine, theirs in zip(self.module.state_dict().values(), model.state_dict().values()):
            if mine.is_floating_point():
                ours.append(mine)
                live.append(theirs)
            else:
                mine.copy_(theirs)
        if ours:
            torch._foreach_lerp_(ours, live, 1.0 - self.decay)


def measure(name: str, rounds: int, steps: int, batch: int, size: int) -> None:
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
    averages = {"hand-written": HandWrittenEma(model, 0.999), "AveragedModel": EmaWeights(model, 0.999)}
    per_round: dict[str, list[float]] = {kind: [] for kind in averages}
    step_s: list[float] = []
    for r in range(rounds):
        order = list(averages) if r % 2 == 0 else list(reversed(averages))
        times: dict[str, list[float]] = {kind: [] for kind in averages}
        for _ in range(steps):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
            step_s.append(time.perf_counter() - start)
            for kind in order:
                start = time.perf_counter()
                averages[kind].update(model)
                times[kind].append(time.perf_counter() - start)
        for kind in averages:
            per_round[kind].append(statistics.median(times[kind]))
        print(f"{name} round {r}: " + ", ".join(f"{kind} {per_round[kind][-1] * 1e3:.3f} ms" for kind in averages), flush=True)
    old, new = (statistics.median(per_round[kind]) for kind in averages)
    step = statistics.median(step_s)
    same = all(
        torch.equal(a, b)
        for a, b in zip(averages["hand-written"].module.state_dict().values(), averages["AveragedModel"].state_dict().values())
    )
    print(
        f"{name}: update per step, median of {rounds} rounds: hand-written {old * 1e3:.3f} ms, AveragedModel {new * 1e3:.3f} ms "
        f"({new / old:.2f}x); the step it follows {step * 1e3:.1f} ms (update {old / step:.2%} -> {new / step:.2%} of it); "
        f"averages bit-identical: {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.models:
        measure(name, args.rounds, args.steps, args.batch, args.size)


if __name__ == "__main__":
    main()
