"""The torch loader: a DataLoader over a ShardSet whose workers build whole batches, as yielded.

A ``BatchRequest`` (epoch, record indices, ring slot, output size) hands one worker a whole batch to
read, decode (``pixels``), augment and, on the CPU, normalize into a ``BatchRing`` slot (persistent
workers), which the caller gets without a copy; on CUDA uint8 batches are copied one batch ahead and
normalized on the GPU. Rule: every random choice for record i of epoch e comes from
``seeding.sample_rng(seed, e, i)``, so batches are the same at any worker count. Both sides prune
torch's ``reductions.shared_cache`` before every batch (docs/measurements.md says why).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from imgpipe._sys.procs import die_with_parent
from imgpipe._sys.torch_private import free_dead_shared_storages, shutdown_persistent_workers
from imgpipe.distenv import DistEnv
from imgpipe.errors import DatasetError, RecordIOError, RemoteError
from imgpipe.format.shardset import PathLike, Records, ShardSet
from imgpipe.image.extensions import warn_if_no_region_decoder
from imgpipe.loaders import seeding
from imgpipe.loaders.base import SampledLoader
from imgpipe.loaders.common import RankStream, default_workers, open_rank_stream
from imgpipe.loaders.geometry import EVAL_CROP_FRACTION, IMAGENET_MEAN, IMAGENET_STD, Crop, EvalGeometry, TrainGeometry, sample_crop
from imgpipe.loaders.options import CURRENT_DEVICE, DEFAULT_PREFETCH_FACTOR, TorchLoaderOptions
from imgpipe.loaders.phase_timer import BatchTimes, PhaseTimer, active_timer, request_delta
from imgpipe.loaders.pixels import UndecodableImage, decode_sample, load_decoders
from imgpipe.loaders.ring import BatchRing, batch_bytes, check_memory, check_shared_memory, ring_slots

logger = logging.getLogger(__name__)

SampleTransform = Callable[[torch.Tensor], torch.Tensor]
UNREADABLE_RECORD = (UndecodableImage, RecordIOError, RemoteError)  # a record on_corrupt="skip" replaces: its bytes, nothing else

# Workers are forked where fork exists: the dataset holds only numpy arrays and opens files
# lazily, so fork is safe, and a rank started with spawn (imgpipe train --gpus N) would otherwise
# spawn its workers too and pay seconds of imports per worker and epoch start.
WORKER_START = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
PIN_MEMORY_IGNORED = (
    "pin_memory=True has no effect on this CPU loader: with persistent workers its batches are views of shared-memory "
    "slots, which are not pinned; pin a batch yourself (batch.pin_memory() copies it), set persistent_workers=False "
    "(the DataLoader then copies each batch into pinned memory), or load onto the GPU with device='cuda'"
)


def die_with_the_loader(worker_id: int) -> None:
    """The DataLoader workers' ``worker_init_fn``: SIGKILL a worker soon after the process it serves
    dies, whichever thread forked it (torch's own watchdog notices only within 5 s, and not a
    worker stuck in a read); exit at once if that process died before the worker got here."""
    loader_pid = get_worker_info().dataset.loader_pid
    die_with_parent(os.getppid() if loader_pid is None else loader_pid)


def normalization(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, bias), each float32 of shape (3, 1, 1) on ``device`` (an image's or a batch's channels):
    (x - mean) / std as x * scale + bias, in-place passes instead of a subtraction and a division."""
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float64)
    std = torch.tensor(IMAGENET_STD, dtype=torch.float64)
    return (1 / std).to(torch.float32).view(3, 1, 1).to(device), (-mean / std).to(torch.float32).view(3, 1, 1).to(device)


class BatchRequest(NamedTuple):
    """One batch to build: the records ``indices`` of ``epoch`` at ``size`` (default: the dataset's
    geometry's), into the ring's ``slot`` if one is given; ``ahead``: the records of the batches the same
    worker builds next, fetched meanwhile (remote shards)."""

    epoch: int
    indices: np.ndarray
    slot: int | None = None
    ahead: tuple[np.ndarray, ...] = ()
    size: int | None = None


class BuiltBatch(NamedTuple):
    """What a worker hands back for one ``BatchRequest`` (a NamedTuple, so the DataLoader pins its tensors).

    ``images``: the ring slot number when the request named one (the batch is in the ring), else a
    uint8 (or normalized float32) NCHW tensor, in shared memory when built in a worker. ``skipped``: the
    record indices replaced (``on_corrupt="skip"``). ``error``: why the batch could not be built, raised
    by the main process as one line (a worker's own exception would arrive as torch's traceback).
    ``times``: the batch's phase times, for a phase timer.
    """

    images: torch.Tensor | int
    labels: torch.Tensor
    skipped: np.ndarray
    error: DatasetError | None = None
    times: BatchTimes | None = None


class BatchDataset(Dataset):
    """Map-style dataset whose items are whole batches: ``dataset[request]`` (a ``BatchRequest`` or an
    ``(epoch, indices)`` pair) is a ``BuiltBatch``. It has no length: the requests of a pass say which
    batches there are. Holds only the ShardSet (numpy arrays), the options, the ring and a few scalars:
    nothing grows per record.
    """

    def __init__(
        self,
        shards: ShardSet,
        geometry: TrainGeometry | EvalGeometry,
        options: TorchLoaderOptions,
        *,
        rank: int,
        phase_timer: PhaseTimer | None = None,
    ) -> None:
        self.shards = shards
        self.geometry = geometry
        self.options = options
        self.rank = rank
        # a GPU gets uint8 HWC batches (a quarter of the bytes, one memcpy per image) and normalizes them itself
        on_gpu = options.device.type == "cuda"
        self.channels_last = options.channels_last or on_gpu
        self.normalize = options.normalize and not on_gpu
        self.ring: BatchRing | None = None  # the loader's, set up with its workers
        self.loader_pid: int | None = None  # the process that starts the workers, their parent (None: a forkserver's)
        self.phase_timer = phase_timer
        self._scale, self._bias = normalization(torch.device("cpu"))
        self._read_s = 0.0  # this batch's read seconds, with a phase_timer
        self._seeded: tuple[int, int] | None = None
        # resolved here, in the process that forks the workers, so they share the import: in each
        # worker it would cost ~170 MB of private memory and a second of the first epoch
        load_decoders()

    def __getitem__(self, request: BatchRequest | tuple[int, np.ndarray]) -> BuiltBatch:
        if self.phase_timer is None:
            return self._build(request)
        self._read_s = 0.0
        source = self.shards.byte_source
        requested = source.request_stats()
        start = time.perf_counter()
        built = self._build(request)
        elapsed = time.perf_counter() - start
        store = request_delta(requested, source.request_stats())
        return built._replace(times=BatchTimes(read=self._read_s, decode=elapsed - self._read_s, **store))

    def _build(self, request: BatchRequest | tuple[int, np.ndarray]) -> BuiltBatch:
        epoch, indices, ring_slot, ahead, size = BatchRequest(*request)
        geometry = self.geometry if size is None else self.geometry.at(size)
        size = geometry.image_size
        in_worker = self._seed_globals(epoch)
        if in_worker:
            free_dead_shared_storages()
        if ring_slot is not None and self.ring is not None:
            images = self.ring.batch(ring_slot, len(indices), size)
            sent: torch.Tensor | int = ring_slot
        else:
            images = sent = torch.empty((len(indices), 3, size, size), dtype=self.dtype, memory_format=self.memory_format)
            if in_worker:  # built in shared memory: sending it copies nothing and leaves no hole in the heap
                images.share_memory_()
        labels = torch.empty(len(indices), dtype=torch.int64)
        records = self._fetch(indices, ahead)
        bad: list[int] = []
        for slot, index in enumerate(indices.tolist()):
            try:
                sample = self._decode(geometry, epoch, index, records, slot)
            except UNREADABLE_RECORD as e:
                if self.options.on_corrupt == "raise":
                    return BuiltBatch(sent, labels, np.zeros(0, np.int64), self._unreadable(e, index))
                bad.append(slot)
                continue
            labels[slot] = int(self.shards.labels[index])
            # outside the try: an error of the user's transform is theirs, never a corrupt record to skip
            sample, wrong = self._transform(sample, index)
            if wrong is not None:
                return BuiltBatch(sent, labels, np.zeros(0, np.int64), wrong)
            self._store(images[slot], sample)
        if bad:
            good = sorted(set(range(len(indices))) - set(bad))
            if not good:
                none = DatasetError(f"no decodable record in a batch of {len(indices)} starting at {self.shards.describe(int(indices[0]))}")
                return BuiltBatch(sent, labels, indices[bad], none)
            for slot in bad:
                donor = next((s for s in good if s > slot), good[0])
                images[slot] = images[donor]
                labels[slot] = labels[donor]
        return BuiltBatch(sent, labels, indices[bad].astype(np.int64))

    def _unreadable(self, error: Exception, index: int) -> DatasetError:
        """The one-line error for record ``index`` that did not read or decode (``on_corrupt="raise"``)."""
        if isinstance(error, RemoteError):
            return DatasetError(f"{error}; on_corrupt='skip' replaces such a record")
        return DatasetError(f"cannot decode {self.shards.describe(index)}: {error}; run 'imgpipe verify' or use on_corrupt='skip'")

    def _decode(self, geometry: TrainGeometry | EvalGeometry, epoch: int, index: int, records: Records, slot: int) -> torch.Tensor:
        """Record ``index`` of ``epoch`` (``records``' ``slot``-th) cropped, resized and flipped: a uint8 CHW tensor (maybe a view);
        one of ``UNREADABLE_RECORD`` when its bytes do not read or decode."""
        _, payload = self._read(records, slot)
        seed = self.options.seed
        crop_for: Callable[[int, int], Crop] = lambda w, h: sample_crop(geometry, w, h, seed=seed, epoch=epoch, index=index)  # noqa: E731
        return decode_sample(payload, crop_for, geometry.image_size)

    def _store(self, out: torch.Tensor, sample: torch.Tensor) -> None:
        """Write one uint8 sample into its place in the batch: as is, or normalized to float32 while it is in cache."""
        if self.normalize:
            out.copy_(sample).mul_(self._scale).add_(self._bias)
        else:
            out.copy_(sample)

    def _fetch(self, indices: np.ndarray, ahead: tuple[np.ndarray, ...]) -> Records:
        """The batch's records: one batched, checked request for remote shards (the next batches' started too)."""
        if self.phase_timer is None:
            return self.shards.fetch(indices, ahead)
        start = time.perf_counter()
        try:
            return self.shards.fetch(indices, ahead)
        finally:
            self._read_s += time.perf_counter() - start

    def _read(self, records: Records, slot: int) -> tuple[Any, memoryview]:
        if self.phase_timer is None:
            return records.read_view(slot)
        start = time.perf_counter()
        try:
            return self.phase_timer.read(records, slot)
        finally:
            self._read_s += time.perf_counter() - start

    def _transform(self, sample: torch.Tensor, index: int) -> tuple[torch.Tensor, DatasetError | None]:
        """``sample_transform`` applied to a copy of ``sample`` the transform may change in place:
        (the result, None), or (sample, the error) if it returned something else than such a sample."""
        transform = self.options.sample_transform
        if transform is None:
            return sample, None
        own = sample.clone()
        result = transform(own)
        if result is own:
            return own, None
        if not isinstance(result, torch.Tensor) or result.shape != own.shape or result.dtype != torch.uint8:
            got = f"{result.dtype} {tuple(result.shape)}" if isinstance(result, torch.Tensor) else type(result).__name__
            return (
                sample,
                DatasetError(
                    f"sample_transform must return a uint8 tensor of shape {tuple(own.shape)}, got {got} for {self.shards.describe(index)}"
                ),
            )
        return result, None

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    @property
    def dtype(self) -> torch.dtype:
        """The batches' pixel type: float32 where the workers normalize, else uint8."""
        return torch.float32 if self.normalize else torch.uint8

    def _seed_globals(self, epoch: int) -> bool:
        """Seed the global generators in a worker (True); leave the user's alone in the main process (False)."""
        info = get_worker_info()
        if info is None:
            return False
        if self._seeded != (epoch, info.id):
            seeding.seed_worker_globals(self.options.seed, epoch, self.rank, info.id)
            self._seeded = (epoch, info.id)
        return True


class RingRequests(Sampler):
    """A DataLoader sampler over the ``queued`` (epoch, indices) batches of a pass at one output size:
    yields them as ``BatchRequest``s, each with a ring slot claimed as the DataLoader takes it.

    ``lookahead`` (remote shards): request j names as ``ahead`` the records of requests j + lookahead,
    j + 2 lookahead, ..., ``depth`` of them: the next ones its worker builds (the DataLoader deals
    requests to its workers in turn), so the worker fetches them while it decodes.
    """

    def __init__(self, ring: BatchRing | None, lookahead: int | None = None, depth: int = 1) -> None:
        self.ring = ring
        self.lookahead = lookahead
        self.depth = depth
        self.queued: list[tuple[int, np.ndarray]] = []
        self.size: int | None = None

    def __len__(self) -> int:
        return len(self.queued)

    def start_pass(self, epoch: int, batches: Sequence[np.ndarray], size: int | None = None) -> None:
        """Queue this pass's batches, at ``size``, and start the ring's pass: call before each ``iter()`` of the DataLoader."""
        self.queued = [(epoch, batch) for batch in batches]
        self.size = size
        if self.ring is not None:
            self.ring.begin_pass()

    def __iter__(self) -> Iterator[BatchRequest]:
        queued, step = self.queued, self.lookahead
        for j, (epoch, indices) in enumerate(queued):
            ahead = (
                () if step is None else tuple(queued[k][1] for k in range(j + step, min(len(queued), j + step * (self.depth + 1)), step))
            )
            yield BatchRequest(epoch, indices, None if self.ring is None else self.ring.claim(), ahead, self.size)


def batch_images(ring: BatchRing | None, sent: torch.Tensor | int, count: int, size: int | None = None) -> torch.Tensor:
    """The images a worker sent back: its tensor, or the first ``count`` images of ``size`` in the ring slot it names."""
    if isinstance(sent, int):
        assert ring is not None
        return ring.receive(sent, count, size)
    return sent


def collate_whole_batch(batch: Any) -> Any:
    """The DataLoader collate function for items that already are whole batches."""
    return batch


class TorchLoader(SampledLoader):
    """Iterable of ``(images, labels)`` batches for this rank; each ``iter()`` is the next epoch."""

    def __init__(self, options: TorchLoaderOptions, stream: RankStream) -> None:
        super().__init__(stream.sampler, stream.env, follow_world=options.rank is None)
        self.options = options
        self.shards = stream.shards
        self.device = options.device
        self.skipped = 0
        self._phase_timer = active_timer()  # the bench's hook: None for everyone else
        self.dataset = BatchDataset(stream.shards, stream.geometry, options, rank=stream.env.rank, phase_timer=self._phase_timer)
        self._ring_size = options.ring_size  # the largest resolution the ring's slots hold
        self._set_up_workers()
        self._scale, self._bias = normalization(self.device)

    def _worker_count(self) -> int:
        workers = self.options.workers
        return default_workers(self.env.local_world_size) if workers is None else workers

    def _set_up_workers(self) -> None:
        """The DataLoader for this rank's worker count, and with persistent workers the ring they build batches in."""
        self._ring = self.dataset.ring = None  # the old ring's memory goes before the new one is allocated
        workers, dataset, options = self._worker_count(), self.dataset, self.options
        parallel = workers > 0
        if parallel and options.persistent_workers:
            self._ring = dataset.ring = BatchRing.for_dataloader(
                workers,
                options.prefetch_factor,
                batch_size=self.sampler.batch_size,
                image_size=self._ring_size,
                memory_format=dataset.memory_format,
                dtype=dataset.dtype,
            )
        remote = self.shards.byte_source.remote  # a worker fetches the records of the batches queued to it after the one it builds
        self._requests = RingRequests(self._ring, max(1, workers) if remote else None, depth=max(1, options.prefetch_factor - 1))
        self._loader = DataLoader(  # the options a DataLoader takes only with workers go to it only then
            dataset,
            sampler=self._requests,
            batch_size=None,
            collate_fn=collate_whole_batch,
            num_workers=workers,
            persistent_workers=options.persistent_workers and parallel,
            prefetch_factor=options.prefetch_factor if parallel else None,
            pin_memory=options.pin_memory and self._ring is None,  # a ring slot is copied into pinned memory by upload()
            multiprocessing_context=(options.multiprocessing_context or WORKER_START) if parallel else None,
            worker_init_fn=die_with_the_loader,
        )

    def _moved(self, env: DistEnv) -> None:
        shutdown_persistent_workers(self._loader)  # forked for the old rank, which seeds their global generators
        self.dataset.rank = env.rank
        if self._worker_count() != self._loader.num_workers:
            del self._loader, self._requests  # and the ring they hold: its memory goes before a new ring is allocated
            self._set_up_workers()

    def _shut_down(self) -> None:
        """Stop the worker processes now (persistent workers otherwise live until the loader is collected)."""
        shutdown_persistent_workers(self._loader)

    def _batches(self, epoch: int, batches: list[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        size = self.sampler.resolution
        self._fit_ring(size)
        if self._ring is None:
            self._check_batch_room(size or self.options.image_size)
        self._requests.start_pass(epoch, batches, size)
        context = self._loader.multiprocessing_context
        self.dataset.loader_pid = None if context is None or context.get_start_method() == "forkserver" else os.getpid()
        built_batches: Iterator[BuiltBatch] = iter(self._loader)
        if self.device.type == "cuda":
            yield from self._cuda_batches(built_batches)
        else:
            for built in built_batches:  # on the CPU the workers built the batch as yielded
                start = time.perf_counter()
                images, labels, _ = self._receive(built)
                self._record_times(built, start)
                self.sampler.mark_consumed()
                yield images, labels

    def _receive(self, built: BuiltBatch) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """A worker's batch as (images, labels, whether the images are a ring slot's view); raises its error."""
        free_dead_shared_storages()
        if built.error is not None:
            raise built.error
        if len(built.skipped):
            self.skipped += len(built.skipped)
            for index in built.skipped.tolist():
                logger.warning("skipped corrupt %s (replaced by another sample of its batch)", self.shards.describe(index))
        return batch_images(self._ring, built.images, len(built.labels), self._requests.size), built.labels, isinstance(built.images, int)

    def _fit_ring(self, size: int | None) -> None:
        """Give the workers a ring whose slots hold ``size``: the workers stop (forked workers keep the
        ring they were started with), the old ring goes (its memory once the caller drops its batches),
        and the next pass starts new workers on a new one."""
        if self._ring is None or size is None or size <= self._ring_size:
            return
        logger.debug("torch loader: a new ring for %d px (was %d); the workers restart", size, self._ring_size)
        shutdown_persistent_workers(self._loader)
        self._ring_size = size
        del self._loader, self._requests  # and the ring they hold: its memory goes before the new ring is allocated
        self._set_up_workers()

    def _check_batch_room(self, size: int) -> None:
        """Without a ring: one line, not the allocator's traceback in a worker or here, where the batches
        of ``size`` px do not fit in shared memory (workers build them there) or in memory (``workers=0``)."""
        batch = batch_bytes(self.sampler.batch_size, size, self.dataset.dtype)
        workers = self._loader.num_workers
        if workers:
            slots = ring_slots(workers, self.options.prefetch_factor)
            check_shared_memory(batch * slots, slots)
        else:
            check_memory(batch, f"batches of {self.sampler.batch_size} images of {size} px", "batch_size or image_size")

    def _record_times(self, built: BuiltBatch, start: float) -> None:
        """Report a batch's phase times: its worker's, and this process's since ``start``."""
        if self._phase_timer is not None and built.times is not None:
            self._phase_timer.record(dataclasses.replace(built.times, collate=time.perf_counter() - start))

    def _finish_on_gpu(self, images: torch.Tensor) -> torch.Tensor:
        """A uint8 batch on the GPU as yielded: float32 normalized, or uint8, in the memory format asked
        (workers build channels_last (HWC) batches for a GPU: one memcpy per image)."""
        memory_format = torch.channels_last if self.options.channels_last else torch.contiguous_format
        if not self.options.normalize:
            return images.contiguous(memory_format=memory_format)
        out = torch.empty(images.shape, dtype=torch.float32, device=images.device, memory_format=memory_format)
        return out.copy_(images).mul_(self._scale).add_(self._bias)  # the copy converts dtype and memory format in one pass

    def _cuda_batches(self, built_batches: Iterator[BuiltBatch]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Copy one batch ahead on a side stream; convert and normalize there; hand over safely.

        Each upload ends with an event, and the consumer's stream waits on that event only: a
        ``wait_stream`` would also wait for the next batch's upload, queued before the handover.
        """
        stream = torch.cuda.Stream(device=self.device)

        def upload(built: BuiltBatch) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.cuda.Event]:
            start = time.perf_counter()
            images, labels, in_ring = self._receive(built)
            if in_ring and self.options.pin_memory:
                images = images.pin_memory()  # copies the slot out
            with torch.cuda.stream(stream):
                # from a slot in pageable memory, a blocking copy: the slot is free once it returns
                images = images.to(self.device, non_blocking=self.options.pin_memory or not in_ring)
                labels = labels.to(self.device, non_blocking=True)
                batch = self._finish_on_gpu(images), labels
                uploaded = torch.cuda.Event()
                uploaded.record(stream)
            self._record_times(built, start)
            return batch, uploaded

        pending = None
        for built in built_batches:
            ready = upload(built)
            if pending is not None:
                yield self._handover(*pending)
            pending = ready
        if pending is not None:
            yield self._handover(*pending)

    def _handover(self, batch: tuple[torch.Tensor, torch.Tensor], uploaded: torch.cuda.Event) -> tuple[torch.Tensor, torch.Tensor]:
        """Make the consumer's stream wait for this batch's upload, and tell the caching allocator
        that the batch (allocated on the side stream) is used there, so its memory is not reused
        before the consumer's work on it is done."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(uploaded)
        for tensor in batch:
            tensor.record_stream(current)
        self.sampler.mark_consumed()
        return batch


def make_torch_loader(
    path: PathLike | Sequence[PathLike] | ShardSet,
    split: str = "train",
    *,
    batch_size: int,
    train: bool = True,
    image_size: int = 224,
    workers: int | None = None,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    device: str | torch.device | None = CURRENT_DEVICE,
    normalize: bool = True,
    channels_last: bool = False,
    crop_ratio: float = EVAL_CROP_FRACTION,
    max_image_size: int | None = None,
    remainder: str = "drop",
    shuffle: bool | None = None,
    block_shuffle: int | None = None,
    shuffle_window: int | None = None,
    on_corrupt: str = "raise",
    sample_transform: SampleTransform | None = None,
    persistent_workers: bool = True,
    prefetch_factor: int = DEFAULT_PREFETCH_FACTOR,
    pin_memory: bool | None = None,
    multiprocessing_context: str | None = None,
    cache_dir: PathLike | None = None,
) -> TorchLoader:
    """A rank-aware, seeded loader of ``(images, labels)`` over packed shards (docs/api.md).

    ``path``: a packed folder, bare .rec files (path, list or glob) or a ShardSet.
    ``image_size``: the output size, until ``loader.set_resolution(px)`` changes it for the next
    ``iter()``; ``max_image_size``: the largest size ``set_resolution`` will ask for, so the ring
    is allocated for it once (a larger one re-sizes the ring and restarts the workers).
    ``crop_ratio`` (eval): the center crop's share of the shorter side (224/256).
    ``workers``: DataLoader worker processes (default ``default_workers()``; 0 decodes in
    this process). ``remainder``: "drop" or "pad" for train, so every rank gets the same
    full batches; eval (``train=False``) yields every record exactly once across ranks.
    ``block_shuffle``: block size for block-wise shuffling on slow storage, with
    ``shuffle_window`` records per shuffle window. ``on_corrupt``: "raise" or "skip"
    (``loader.skipped`` counts). ``sample_transform``: optional user callable on each
    uint8 CHW sample (same shape out), run in the workers after imgpipe's geometry.
    ``persistent_workers`` (default True) keeps the workers from epoch to epoch and lets them
    build batches in a ring of ``workers * prefetch_factor + 2`` batches in shared memory,
    allocated once (``ConfigError`` when /dev/shm has less room free); a batch is a view of its
    slot, which is reused once the caller holds nothing on it (docs/api.md says what
    holds a slot; clone a batch before sending it to another process). ``pin_memory`` (default:
    on CUDA) puts batches in pinned memory for the copy to the GPU; on the CPU it applies only
    without the ring (``persistent_workers=False`` or ``workers=0``): ring slots are not pinned,
    and one warning says so. ``persistent_workers``, ``prefetch_factor``, ``pin_memory`` and
    ``multiprocessing_context`` (default: fork where there is fork) go to the DataLoader (with
    ``workers=0`` it has no workers, so only ``pin_memory`` applies).
    ``cache_dir``: with a URL, a node-local folder that keeps what is read (and fetches the rest
    in the background) and becomes the dataset's packed folder; see docs/remote.md. From a URL a
    worker fetches the records of the ``prefetch_factor - 1`` batches queued to it after the one it
    builds (at least 1) while it decodes.
    ``loader.close()`` stops persistent workers.
    """
    options = TorchLoaderOptions(**{name: value for name, value in locals().items() if name != "path"})
    warn_if_no_region_decoder()
    if options.pin_memory and options.device.type == "cpu" and options.persistent_workers and options.workers != 0:
        logger.warning(PIN_MEMORY_IGNORED)
    return TorchLoader(options, open_rank_stream(path, options))
