"""The bench's instrumented input pipeline: every stage of every batch is timed where it runs.

Stages, as ``imgpipe.loaders.torch`` runs them:

========== ============================================== ====================
stage      what                                           timed in
========== ============================================== ====================
read       ``pread`` of one record from its shard         loader worker
decode     JPEG decode + random-resized-crop + flip -> CHW loader worker
collate    stacking a batch (+ pinning it on a GPU run)   worker / rank
h2d        host-to-device copy (0 on the CPU)             rank
compute    the model's forward+backward, or --compute-ms  rank
sync       waiting for the other ranks (all-reduce)       rank
========== ============================================== ====================

``wait`` is the time a rank spends in ``next(loader)``: the data-wait the GPU sees.

Test and diagnostic hook: ``IMGPIPE_BENCH_READ_DELAY_MS_RANK<r>=<ms>`` makes rank ``r``
sleep that long on each record read, as a slow disk would. It lets a test (or a user who
wants to see what a slow disk does to a job) slow one rank on purpose; nothing else reads it.
"""

from __future__ import annotations

import io
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from imgpipe.errors import DatasetError
from imgpipe.recordio import IRHeader
from imgpipe.sampler import rank_indices
from imgpipe.seeding import sample_rng
from imgpipe.shards import ShardSet, open_shards
from imgpipe.train.metrics import RankSummary, StepRecord, summarize
from imgpipe.transforms import TrainGeometry

READ_DELAY_ENV = "IMGPIPE_BENCH_READ_DELAY_MS_RANK{rank}"
STAGES = ("read", "decode", "collate", "h2d", "compute", "sync")
LOADER_STAGES = ("read", "decode", "collate")


def read_delay_s(rank: int, environ: dict[str, str] | None = None) -> float:
    """The per-record read delay the diagnostic hook asks for on ``rank`` (seconds)."""
    env = os.environ if environ is None else environ
    name = READ_DELAY_ENV.format(rank=rank)
    raw = env.get(name, "")
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise DatasetError(f"{name}={raw!r} is not a number of milliseconds") from None
    return max(value, 0.0) / 1000.0


class DelayedReads:
    """A ShardSet whose ``read`` sleeps ``delay_s`` per record: the diagnostic hook's slow disk."""

    def __init__(self, shards: ShardSet, delay_s: float) -> None:
        self.shards = shards
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.shards)

    def read(self, i: int) -> tuple[IRHeader, bytes]:
        item = self.shards.read(i)
        time.sleep(self.delay_s)
        return item


def open_for_rank(folder: str | os.PathLike, split: str, rank: int) -> ShardSet | DelayedReads:
    """The split's ShardSet, slowed by the read-delay hook when it is set for ``rank``."""
    shards = open_shards(folder, split)
    delay = read_delay_s(rank)
    return DelayedReads(shards, delay) if delay else shards


class TimedDataset:
    """Map-style dataset over one rank's record indices; each item carries its stage times."""

    def __init__(self, source: ShardSet | DelayedReads, indices: np.ndarray, image_size: int, seed: int) -> None:
        self.source = source
        self.indices = indices
        self.geometry = TrainGeometry(image_size=image_size)
        self.seed = seed

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, position: int) -> tuple[Any, int, float, float]:
        from PIL import Image

        t0 = time.perf_counter()
        index = int(self.indices[position])
        header, payload = self.source.read(index)
        t1 = time.perf_counter()
        size = self.geometry.image_size
        with Image.open(io.BytesIO(payload)) as img:
            stored = img.size
            crop = self.geometry.sample(stored[0], stored[1], sample_rng(self.seed, 0, index))
            # decode reduced in the DCT domain when the crop will be downscaled anyway
            img.draft("RGB", (math.ceil(stored[0] * size / crop.width), math.ceil(stored[1] * size / crop.height)))
            sx, sy = img.width / stored[0], img.height / stored[1]
            box = (crop.left * sx, crop.top * sy, (crop.left + crop.width) * sx, (crop.top + crop.height) * sy)
            image = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR, box=box)
        if crop.flip:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        tensor = _to_chw(image)
        t2 = time.perf_counter()
        return tensor, int(header.label), t1 - t0, t2 - t1


def _to_chw(image: Any) -> Any:
    import torch

    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()


def timed_collate(items: list[tuple[Any, int, float, float]]) -> dict[str, Any]:
    """Stack a batch and sum its items' read and decode times; time the stacking itself."""
    import torch

    t0 = time.perf_counter()
    images = torch.stack([item[0] for item in items])
    labels = torch.tensor([item[1] for item in items], dtype=torch.int64)
    return {
        "images": images,
        "labels": labels,
        "read": sum(item[2] for item in items),
        "decode": sum(item[3] for item in items),
        "collate": time.perf_counter() - t0,
    }


def bench_indices(n: int, *, rank: int, world_size: int, batch_size: int, count: int, seed: int) -> np.ndarray:
    """``count`` record indices for ``rank``: its part of epoch 0, 1, ... as the loaders shard them."""
    parts, total, epoch = [], 0, 0
    while total < count:
        part = rank_indices(n, seed=seed, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size)
        if part.size == 0:
            raise DatasetError(f"{n} records give rank {rank} of {world_size} no full batch of {batch_size}; lower --batch-size")
        parts.append(part)
        total += part.size
        epoch += 1
    return np.concatenate(parts)[:count]


# ----------------------------------------------------------------------------- per-step records


@dataclass
class StepTimes:
    """One measured step of one rank, in seconds; ``start`` is relative to the run's start."""

    start: float
    wait: float
    read: float = 0.0
    decode: float = 0.0
    collate: float = 0.0
    h2d: float = 0.0
    compute: float = 0.0
    sync: float = 0.0

    @property
    def total(self) -> float:
        return self.wait + self.h2d + self.compute + self.sync


@dataclass
class RankStats:
    """What one rank measured in one (backend, workers) run.

    ``timed_stages`` is False when the loader does read/decode/collate internally (DALI):
    those stages are then unknown, not zero.
    """

    rank: int
    batch_size: int
    timed_stages: bool = True
    steps: list[StepTimes] = field(default_factory=list)

    def summary(self) -> RankSummary:
        """images/s, data-wait fraction and step percentiles, as the trainer reports them."""
        records = [StepRecord(s.wait, s.total - s.wait, self.batch_size) for s in self.steps]
        return summarize(records, self.rank)

    def stage_ms(self) -> dict[str, float | None]:
        """Mean milliseconds per batch of each stage (read/decode/collate are summed worker time)."""
        means: dict[str, float | None] = {}
        for name in STAGES:
            untimed = not self.steps or (not self.timed_stages and name in LOADER_STAGES)
            means[name] = None if untimed else 1000 * float(np.mean([getattr(s, name) for s in self.steps]))
        return means

    @property
    def own_images_per_s(self) -> float:
        """images/s without the time spent waiting for other ranks: this rank's speed alone."""
        own = sum(s.total - s.sync for s in self.steps)
        return self.batch_size * len(self.steps) / own if own > 0 else 0.0
