"""The bench's instrumented torch loader: the torch loader's own worker code, with every stage timed.

Each worker request builds a whole batch with :class:`imgpipe.loaders.torch.BatchDataset`
(pread -> JPEG decode, reduced in the DCT domain when the crop allows -> random-resized-crop
+ flip -> uint8 slot of the batch), exactly as ``make_torch_loader`` does; the bench only
wraps it to report the seconds spent reading and decoding each batch.

============ =================================================== ===============
stage        what                                                timed in
============ =================================================== ===============
read         ``pread`` of the batch's records from their shards  loader worker
decode       decode + crop + flip + writing into the batch       loader worker
collate      pinning the batch for the copy (GPU runs)           rank
h2d          host-to-device copy (0 on the CPU)                  rank
compute      the model's forward+backward+step, or --compute-ms  rank
sync         all-reduce with the other ranks                     rank
============ =================================================== ===============

``wait`` is the time a rank is blocked in ``next(loader)``: the data-wait the GPU sees.

Test and diagnostic hook: ``IMGPIPE_BENCH_READ_DELAY_MS_RANK<r>=<ms>`` makes rank ``r``
sleep that long on each record it reads, as a slow disk would. It lets a test (or a user who
wants to see what a slow disk does to a job) slow one rank on purpose; nothing else reads it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

import numpy as np

from imgpipe.errors import DatasetError
from imgpipe.loaders.ring import BatchRing
from imgpipe.loaders.torch import DEFAULT_PREFETCH_FACTOR, WORKER_START, BatchDataset, RingRequests, batch_images, collate_whole_batch
from imgpipe.format.recordio import IRHeader
from imgpipe.loaders.sampler import EpochSampler
from imgpipe.format.shardset import ShardSet, open_shards
from imgpipe.loaders.geometry import TrainGeometry

READ_DELAY_ENV = "IMGPIPE_BENCH_READ_DELAY_MS_RANK{rank}"


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


class TimedReads:
    """A ShardSet whose ``read`` is timed into ``read_s`` (and slowed by ``delay_s``, the hook)."""

    def __init__(self, shards: ShardSet, delay_s: float = 0.0) -> None:
        self.shards = shards
        self.delay_s = delay_s
        self.read_s = 0.0

    def __len__(self) -> int:
        return len(self.shards)

    def __getattr__(self, name: str) -> Any:
        if name == "shards":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.shards, name)

    def read(self, i: int) -> tuple[IRHeader, bytes]:
        start = time.perf_counter()
        item = self.shards.read(i)
        if self.delay_s:
            time.sleep(self.delay_s)
        self.read_s += time.perf_counter() - start
        return item


def open_for_rank(folder: str | os.PathLike, split: str, rank: int) -> TimedReads:
    """The split's records with timed reads, slowed by the read-delay hook when it is set for ``rank``."""
    return TimedReads(open_shards(folder, split), read_delay_s(rank))


class TimedBatchDataset(BatchDataset):
    """The torch loader's BatchDataset; each item also carries its batch's read and decode seconds."""

    shards: TimedReads

    def __getitem__(self, request: tuple[int, np.ndarray]) -> tuple[Any, Any, float, float, str | None]:  # type: ignore[override]
        self.shards.read_s = 0.0
        start = time.perf_counter()
        images, labels, _skipped, error = super().__getitem__(request)
        total = time.perf_counter() - start
        return images, labels, self.shards.read_s, total - self.shards.read_s, error


def make_timed_dataset(
    reads: TimedReads, *, image_size: int, seed: int, rank: int, channels_last: bool, ring: BatchRing | None = None
) -> TimedBatchDataset:
    """A training-geometry TimedBatchDataset, configured as ``make_torch_loader(train=True)`` configures its own."""
    geometry = TrainGeometry(image_size=image_size)
    return TimedBatchDataset(reads, geometry=geometry, seed=seed, rank=rank, channels_last=channels_last, ring=ring)  # type: ignore[arg-type]


def bench_requests(n: int, *, rank: int, world_size: int, batch_size: int, batches: int, seed: int) -> list[tuple[int, np.ndarray]]:
    """``batches`` (epoch, record indices) requests for ``rank``: its batches of epoch 0, 1, ... as the loaders shard them."""
    sampler = EpochSampler(n, batch_size=batch_size, train=True, seed=seed, rank=rank, world_size=world_size)
    requests: list[tuple[int, np.ndarray]] = []
    epoch = 0
    while len(requests) < batches:
        epoch_batches = sampler.batches(epoch)
        if not epoch_batches:
            raise DatasetError(f"{n} records give rank {rank} of {world_size} no full batch of {batch_size}; lower --batch-size")
        requests.extend((epoch, batch) for batch in epoch_batches)
        epoch += 1
    return requests[:batches]


Batch = tuple[Any, Any, float, float, float]  # images, labels, read s, decode s, collate s


def torch_batches(
    reads: TimedReads, *, batches: int, rank: int, world_size: int, device: Any, batch_size: int, image_size: int, seed: int, workers: int
) -> Iterator[Batch]:
    """``batches`` batches of this rank through the torch loader's BatchDataset in a DataLoader, with their stage times.

    With workers, they decode into a shared-memory ring as the torch loader's do; a batch's slot
    is released when the consumer asks for the next batch (it has copied or used it by then).
    """
    import torch
    from torch.utils.data import DataLoader

    channels_last = device.type == "cuda"
    ring = None
    if workers:
        layout = torch.channels_last if channels_last else torch.contiguous_format
        ring = BatchRing.for_dataloader(workers, DEFAULT_PREFETCH_FACTOR, batch_size=batch_size, image_size=image_size, memory_format=layout)
    requests = RingRequests(ring)
    requests.queued = bench_requests(len(reads), rank=rank, world_size=world_size, batch_size=batch_size, batches=batches, seed=seed)
    dataset = make_timed_dataset(reads, image_size=image_size, seed=seed, rank=rank, channels_last=channels_last, ring=ring)
    loader = DataLoader(
        dataset,
        sampler=requests,
        batch_size=None,
        collate_fn=collate_whole_batch,
        num_workers=workers,
        prefetch_factor=DEFAULT_PREFETCH_FACTOR if workers else None,
        # ranks started with spawn would spawn their workers too (seconds of imports each run);
        # fork is what a torchrun-started rank uses on Linux
        multiprocessing_context=WORKER_START if workers else None,
    )
    for sent, labels, read, decode, error in loader:
        if error is not None:
            raise DatasetError(error)
        yield batch_images(ring, sent, len(labels)), labels, read, decode, 0.0
        if ring is not None:
            ring.release()


def dali_batches(
    data: str | os.PathLike, split: str, *, rank: int, world_size: int, device: Any, batch_size: int, image_size: int, seed: int, workers: int
) -> Iterator[Batch]:
    """Endless batches of this rank from ``make_dali_loader`` (epoch after epoch); its stages are not visible."""
    from imgpipe.loaders.dali import make_dali_loader

    loader = make_dali_loader(
        data, split, batch_size=batch_size, train=True, image_size=image_size, workers=max(1, workers), seed=seed,
        rank=rank, world_size=world_size, device=device if device.type == "cuda" else None, normalize=False,
    )
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for images, labels in loader:
            yield images, labels, 0.0, 0.0, 0.0
        epoch += 1
