"""Phase times hold when the work of a phase finishes after its call returns, as on a GPU."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")

from imgpipe.bench.clock import PhaseClock  # noqa: E402
from imgpipe.bench.runner import _step  # noqa: E402


class AsyncQueue:
    """A fake device queue: each submitted phase runs in a thread, like a kernel after its launch returns."""

    def __init__(self) -> None:
        self.running: list[threading.Thread] = []

    def submit(self, seconds: float) -> None:
        thread = threading.Thread(target=time.sleep, args=(seconds,))  # elapsed time is what is tested: the phase's time on the queue
        thread.start()
        self.running.append(thread)

    def settle(self) -> None:
        while self.running:
            self.running.pop().join()


class AsyncCompute:
    """The bench's Compute interface with phases that return at once and finish later."""

    def __init__(self, queue: AsyncQueue, step_s: float, sync_s: float, update_s: float) -> None:
        self.queue, self.step_s, self.sync_s, self.update_s = queue, step_s, sync_s, update_s

    def step(self, images: Any, labels: Any) -> None:
        self.queue.submit(self.step_s)

    def sync(self) -> None:
        self.queue.submit(self.sync_s)

    def update(self) -> None:
        self.queue.submit(self.update_s)


def batches() -> Iterator[tuple[Any, Any]]:
    while True:
        yield None, None


def test_a_slow_phase_on_the_cpu_is_timed_by_the_plain_clock() -> None:
    clock = PhaseClock(torch.device("cpu"))
    start = clock.now()
    time.sleep(0.03)  # elapsed time is what is tested
    assert clock.now() - start >= 0.03


def test_each_phase_is_charged_its_own_asynchronous_work() -> None:
    """A 60 ms all-reduce that returns at once is charged to sync, not to the next phase (issue 16 item 1)."""
    queue = AsyncQueue()
    compute = AsyncCompute(queue, step_s=0.02, sync_s=0.06, update_s=0.01)
    clock = PhaseClock(torch.device("cpu"), settle=queue.settle)
    steps = [_step(batches(), compute, clock, None, 0.0) for _ in range(2)]
    for step in steps:
        assert step.sync >= 0.06
        assert step.compute >= 0.02 + 0.01
    assert steps[1].start >= steps[0].start + 0.09  # the first step's work ended before the second began


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_now_returns_once_the_queued_kernels_are_done() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    clock = PhaseClock(device)
    a = torch.randn(4096, 4096, device=device)
    for _ in range(20):
        a = a @ a / 4096
    clock.now()
    assert torch.cuda.current_stream(device).query()
