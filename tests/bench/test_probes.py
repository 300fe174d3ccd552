"""The bench's torch loader is make_torch_loader with its phase-timing hook: the same batches, timed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import pytest

torch = pytest.importorskip("torch")

from imgpipe.bench.config import BenchConfig  # noqa: E402
from imgpipe.bench.probes import endless, make_loader  # noqa: E402
from imgpipe.loaders.phase_timer import BatchTimes, PhaseTimer, active_timer, timing  # noqa: E402
from imgpipe.loaders.torch import make_torch_loader  # noqa: E402
from imgpipe.train.launch import launch  # noqa: E402
from imgpipe.train.rank import RankContext  # noqa: E402


class SlowReads(PhaseTimer):
    """The phase timer, each record read slowed by ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def read(self, records: object, k: int) -> tuple[object, memoryview]:
        item = super().read(records, k)
        time.sleep(self.delay_s)  # elapsed time is what is tested: the read phase must count it
        return item


def cpu_rank() -> RankContext:
    """The context the launcher gives a single CPU rank (it runs in this process)."""
    return launch(lambda ctx, _: ctx, None, gpus=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 1])
def test_probe_batches_are_the_loaders_batches(packed_dir: Path, workers: int) -> None:
    """Ten batches over two epochs: identical to an untimed loader's, each with its worker's and the main process's times."""
    timer = PhaseTimer()
    train = BenchConfig(data=str(packed_dir), batch_size=8, image_size=24, seed=3).train_config(workers, torch.device("cpu"))
    probe = make_loader("torch", train, cpu_rank(), timer)
    seen = []
    for _, (images, labels) in zip(range(10), endless(probe)):
        times = timer.take()
        assert times.read > 0 and times.decode > 0 and times.collate > 0
        seen.append((images, labels))
    probe.close()
    assert timer.take() == BatchTimes()  # nothing left over: one report per batch
    plain = make_torch_loader(packed_dir, "train", batch_size=8, image_size=24, seed=3, rank=0, world_size=1, workers=0)
    expected = []
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        expected.extend(plain)
    assert len(plain) == 6 and len(seen) == 10
    for (x, y), (x0, y0) in zip(seen, expected):
        assert torch.equal(x, x0) and torch.equal(y, y0)


@pytest.mark.timeout(60)
def test_slow_reads_are_timed_as_reads(packed_dir: Path) -> None:
    """A slower read (the bench tests' slow-disk hook slows it so) lands in the read phase of the batch, in a worker process."""
    timer = SlowReads(delay_s=0.02)
    with timing(timer):
        loader = make_torch_loader(packed_dir, "train", batch_size=4, image_size=16, rank=0, world_size=1, workers=1)
    batches = [batch for _, batch in zip(range(2), loader)]
    loader.close()
    times = [timer.take() for _ in batches]
    assert len(times) == 2 and all(t.read >= 4 * 0.02 for t in times)


def test_the_timer_hooks_in_only_around_the_factory_call(synth_pack: Callable[..., Path]) -> None:
    """A loader made inside ``timing`` reports to its timer for its whole life; one made after the block, to none."""
    data = synth_pack(classes=2, per_class=4, shards=1, min_side=32, max_side=48)
    timer = PhaseTimer()
    with timing(timer):
        timed = make_torch_loader(data, "train", batch_size=4, image_size=16, rank=0, world_size=1, workers=0)
    assert active_timer() is None
    plain = make_torch_loader(data, "train", batch_size=4, image_size=16, rank=0, world_size=1, workers=0)
    assert len(list(plain)) == 2 and timer.take() == BatchTimes()
    assert len(list(timed)) == 2 and timer.take().decode > 0 and timer.take().decode > 0
