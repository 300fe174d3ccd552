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
from pathlib import Path
from typing import Any

import numpy as np

from imgpipe.errors import DatasetError
from imgpipe.manifest import load_manifest
from imgpipe.recordio import read_index, read_record_at, unpack_header
from imgpipe.sampler import rank_indices
from imgpipe.seeding import sample_rng
from imgpipe.transforms import TrainGeometry

READ_DELAY_ENV = "IMGPIPE_BENCH_READ_DELAY_MS_RANK{rank}"
STAGES = ("read", "decode", "collate", "h2d", "compute", "sync")


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


class RecordSource:
    """The records of one split of a packed folder, addressed by record index 0..N-1.

    File handles are opened lazily per process, so the object survives a DataLoader fork.
    """

    def __init__(self, folder: str | os.PathLike, split: str, *, delay_s: float = 0.0) -> None:
        self.folder = Path(folder)
        manifest = load_manifest(self.folder)
        if split not in manifest.splits:
            raise DatasetError(f"{self.folder}: no split {split!r} in the manifest (it has {', '.join(sorted(manifest.splits))})")
        shards = manifest.splits[split].shards
        self.rec_paths = [self.folder / s.name for s in shards]
        self.idx_paths = [self.folder / s.index for s in shards]
        offsets, which = [], []
        for number, (rec, idx) in enumerate(zip(self.rec_paths, self.idx_paths)):
            if not rec.is_file():
                raise DatasetError(f"{rec}: shard listed in the manifest is missing; rerun 'imgpipe pack'")
            offsets.append(read_index(idx)[1])
            which.append(np.full(len(offsets[-1]), number, dtype=np.int32))
        self._offsets = np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
        self._shard = np.concatenate(which) if which else np.zeros(0, np.int32)
        self._ends = [p.stat().st_size for p in self.rec_paths]
        self.classes = len(manifest.classes)
        self.delay_s = delay_s
        self._fds: dict[int, int] = {}
        self._pid = -1

    def __len__(self) -> int:
        return int(self._offsets.size)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fds"], state["_pid"] = {}, -1
        return state

    def read(self, index: int) -> bytes:
        """The raw record (IRHeader + image) at record index ``index``."""
        if self._pid != os.getpid():
            self._fds, self._pid = {}, os.getpid()
        shard = int(self._shard[index])
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.rec_paths[shard], os.O_RDONLY)
        record, _ = read_record_at(fd, int(self._offsets[index]), self._ends[shard], self.rec_paths[shard])
        if self.delay_s:
            time.sleep(self.delay_s)
        return record


class TimedDataset:
    """Map-style dataset over one rank's record indices; each item carries its stage times."""

    def __init__(self, source: RecordSource, indices: np.ndarray, image_size: int, seed: int) -> None:
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
        record = self.source.read(index)
        t1 = time.perf_counter()
        header, payload = unpack_header(record)
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
    """What one rank measured for one (backend, workers) run."""

    rank: int
    batch_size: int
    steps: list[StepTimes] = field(default_factory=list)
    start_time: float = 0.0
    end_time: float = 0.0

    @property
    def images(self) -> int:
        return self.batch_size * len(self.steps)

    @property
    def seconds(self) -> float:
        return sum(s.total for s in self.steps)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def data_wait_frac(self) -> float:
        return sum(s.wait for s in self.steps) / self.seconds if self.seconds > 0 else 0.0

    def batch_ms(self, q: float) -> float:
        return float(np.percentile([s.total for s in self.steps], q) * 1000) if self.steps else 0.0

    def stage_ms(self) -> dict[str, float | None]:
        """Mean milliseconds per batch of each stage (read/decode/collate are worker time)."""
        if not self.steps:
            return {name: None for name in STAGES}
        return {name: 1000 * float(np.mean([getattr(s, name) for s in self.steps])) for name in STAGES}

    @property
    def own_ms(self) -> float:
        """Mean step time without the wait for other ranks: what this rank alone would take."""
        return 1000 * float(np.mean([s.total - s.sync for s in self.steps])) if self.steps else 0.0
