"""The bench's torch loader is make_torch_loader with its stage-timing hook: the same batches, timed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from imgpipe.bench.config import BenchConfig  # noqa: E402
from imgpipe.bench.probes import endless, make_loader  # noqa: E402
from imgpipe.loaders.stage_timer import BatchTimes, StageTimer  # noqa: E402
from imgpipe.loaders.torch import make_torch_loader  # noqa: E402
from imgpipe.train.launch import launch  # noqa: E402
from imgpipe.train.rank import RankContext  # noqa: E402


class SlowReads(StageTimer):
    """The stage timer, each record read slowed by ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def read(self, records: object, k: int) -> tuple[object, memoryview]:
        item = super().read(records, k)
        time.sleep(self.delay_s)  # elapsed time is what is tested: the read stage must count it
        return item


def cpu_rank() -> RankContext:
    """The context the launcher gives a single CPU rank (it runs in this process)."""
    return launch(lambda ctx, _: ctx, None, gpus=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 1])
def test_probe_batches_are_the_loaders_batches(packed_dir: Path, workers: int) -> None:
    """Ten batches over two epochs: identical to an untimed loader's, each with its worker's and the main process's times."""
    timer = StageTimer()
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
    """A slower read (the bench tests' slow-disk hook slows it so) lands in the read stage of the batch, in a worker process."""
    timer = SlowReads(delay_s=0.02)
    loader = make_torch_loader(packed_dir, "train", batch_size=4, image_size=16, rank=0, world_size=1, workers=1, stage_timer=timer)
    batches = [batch for _, batch in zip(range(2), loader)]
    loader.close()
    times = [timer.take() for _ in batches]
    assert len(times) == 2 and all(t.read >= 4 * 0.02 for t in times)
