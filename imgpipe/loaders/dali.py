"""NVIDIA DALI loader over imgpipe shards: same arguments and output contract as the torch loader.

``nvidia.dali`` is imported here only, lazily, so imgpipe works without it installed.

How an epoch maps onto DALI
---------------------------
Each train epoch gets its own DALI pipeline, with every seed derived from ``(seed, rank,
epoch)``: an epoch is a pure function of those, so ``set_epoch(e)`` is exact and runs
reproduce (building one costs well under a second, against minutes for an ImageNet epoch).
Eval has no randomness: its pipeline is built once and kept while epochs run to their end.
``fn.readers.mxnet`` reads all ``.rec`` files of the split through ONE combined index
(offsets cumulative over the files, as DALI requires) and splits the records into
``world_size`` contiguous shards (DALI's rule: shard k holds records
``floor(N*k/W) .. floor(N*(k+1)/W) - 1``).

* Train: rank r reads shard ``(r + epoch) % W`` (so every rank sees all the data over W
  epochs and ranks are disjoint within an epoch), shuffled in a buffer of ``initial_fill``
  records. Every rank yields exactly ``(N // W) // batch_size`` full batches; the rest of the
  shard is dropped (``LastBatchPolicy.DROP``), so DDP never waits on a rank that ran out.
* Eval: rank r always reads shard r in stored order, ``pad_last_batch=True`` with
  ``LastBatchPolicy.PARTIAL``: the padded duplicates are removed, so across ranks every
  record is yielded exactly once; ranks differ by at most one partial batch.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from imgpipe.errors import ConfigError, DatasetError, ImgpipeError
from imgpipe.loaders.common import CURRENT_DEVICE, ON_CORRUPT, check_choice, check_int, check_loader_args, default_workers, no_full_batch, open_for_rank
from imgpipe.format.dali_index import write_dali_index
from imgpipe.format.shardset import ShardSet

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'imgpipe[dali]'"
READER_NAME = "Reader"
_DECODING_OPERATORS = ("decoders", "peek_image_shape")  # in DALI's message when a record did not decode
DEFAULT_INITIAL_FILL = 1024
_SEED_DOMAIN = 0x44414C49  # "DALI": keeps these seeds apart from imgpipe.loaders.seeding's families


def dali_available() -> bool:
    """True when ``nvidia.dali`` (any CUDA flavour of the wheel) can be imported."""
    try:
        _import_dali()
    except ConfigError:
        return False
    return True


def _import_dali() -> Any:
    try:
        import nvidia.dali as dali
        import nvidia.dali.plugin.pytorch  # noqa: F401  (the DALIGenericIterator)
    except ModuleNotFoundError as e:
        raise ConfigError(f"NVIDIA DALI is not installed ({e}); {INSTALL_HINT} to use the DALI loader") from None
    except Exception as e:  # an installed wheel that fails to import: a missing library, a mismatched build
        raise ConfigError(f"NVIDIA DALI is installed but does not import ({type(e).__name__}: {e}); reinstall it: {INSTALL_HINT}") from None
    return dali


@dataclass(frozen=True)
class _Spec:
    """Everything one epoch's pipeline depends on, besides the epoch itself."""

    rec_files: tuple[str, ...]
    index_file: str
    records: int
    batch_size: int
    train: bool
    image_size: int
    workers: int
    seed: int
    rank: int
    world_size: int
    device_id: int | None
    normalize: bool
    channels_last: bool
    initial_fill: int
    prefetch: int


def epoch_seeds(seed: int, rank: int, epoch: int) -> dict[str, int]:
    """The DALI seeds (31-bit) of one rank's epoch, derived from (seed, rank, epoch) only."""
    words = np.random.SeedSequence([_SEED_DOMAIN, seed, rank, epoch]).generate_state(4, np.uint32) & 0x7FFFFFFF
    return dict(zip(("pipeline", "reader", "crop", "flip"), (int(w) for w in words)))


def shard_bounds(records: int, shard: int, shards: int) -> tuple[int, int]:
    """Record range [start, end) of DALI reader shard ``shard`` of ``shards``."""
    return records * shard // shards, records * (shard + 1) // shards


class DaliLoader:
    """Iterable of ``(images, labels)`` batches; each new ``iter()`` is the next epoch."""

    def __init__(self, spec: _Spec, shards: ShardSet) -> None:
        self._spec = spec
        self._shards = shards  # to name a record DALI could not decode
        self._next_epoch = 0
        self.epoch = 0  # the epoch being (or last) iterated, as TorchLoader.epoch
        self.skipped = 0  # DALI never replaces a record: a corrupt one stops the epoch with a DatasetError
        self._eval_iterator: Any = None
        self._consumed = 0  # batches of ``epoch`` yielded so far
        self._resume_skip = 0  # batches to read and drop at the start of the next epoch (load_state_dict)
        start, end = shard_bounds(spec.records, spec.rank, spec.world_size)
        if spec.train:
            self._batches = (spec.records // spec.world_size) // spec.batch_size
        else:
            self._batches = math.ceil((end - start) / spec.batch_size)

    @property
    def batch_size(self) -> int:
        return self._spec.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next ``iter()``; later iterations continue from it."""
        self._next_epoch = check_int("epoch", epoch, minimum=0)

    def __len__(self) -> int:
        return self._batches

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the batches of it already yielded, for a checkpoint."""
        return {"epoch": self.epoch, "batches": self._consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: DALI cannot seek, so the next ``iter()`` reads the batches already yielded again and drops them."""
        if not isinstance(state, dict):
            raise ConfigError(f"cannot resume: a loader state is the dict loader.state_dict() returned, got {type(state).__name__}")
        self._next_epoch = check_int("epoch", state.get("epoch"), minimum=0)
        self._resume_skip = check_int("batches", state.get("batches"), minimum=0)

    def close(self) -> None:
        """Drop the pipeline kept for the next eval epoch."""
        self._eval_iterator = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.epoch = self._next_epoch
        self._next_epoch += 1
        self._consumed = 0
        skip, self._resume_skip = self._resume_skip, 0
        batches = self._run_epoch(self.epoch)
        if skip:
            logger.warning("resuming mid-epoch: the dali loader cannot seek, so it reads the %d batches of epoch %d already trained on again", skip, self.epoch)
            for _ in range(skip):
                next(batches, None)
        return batches

    def _run_epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        spec = self._spec
        if self._batches == 0:
            return
        try:
            iterator = self._eval_iterator or self._make_iterator(epoch)
            batches = iter(iterator)  # DALI's __iter__ resets a finished iterator for the next epoch
        except RuntimeError as e:
            raise self._decode_error(e, epoch, 0) from None
        self._eval_iterator = None  # handed back below only once this epoch has run to its end
        device = torch.device("cpu") if spec.device_id is None else torch.device("cuda", spec.device_id)
        produced = 0
        while True:
            try:
                (out,) = next(batches)
            except StopIteration:
                break
            except RuntimeError as e:
                raise self._decode_error(e, epoch, produced) from None
            labels = out["labels"].reshape(-1)
            if labels.numel() == 0:  # PARTIAL can end on a batch made only of padding
                continue
            images = out["images"]
            if spec.channels_last:  # HWC from DALI: an NCHW view with channels_last strides
                images = images.permute(0, 3, 1, 2)
            produced += 1
            self._consumed = produced
            yield images, labels.to(device=device, dtype=torch.int64, non_blocking=True)
        if produced != self._batches:
            logger.warning("DALI epoch %d gave %d batches, expected %d", epoch, produced, self._batches)
        if not spec.train:  # eval epochs are all alike: keep the warm pipeline for the next one
            self._eval_iterator = iterator

    def _decode_error(self, error: RuntimeError, epoch: int, produced: int) -> Exception:
        """A DALI decoder failure as the torch loader's one-line DatasetError (shard, record, source); anything else unchanged.

        DALI's message does not say which record failed, so the records this rank's reader has
        reached are checked in stored order with Pillow, as ``imgpipe verify --decode`` does. The
        reader reads its shard in stored order (train shuffles inside a buffer of what it read),
        so this costs about what DALI decoded before it failed; eval skips the batches it yielded.
        """
        if not any(op in str(error) for op in _DECODING_OPERATORS):
            return error
        spec = self._spec
        start, end = shard_bounds(spec.records, (spec.rank + epoch) % spec.world_size if spec.train else spec.rank, spec.world_size)
        first = start if spec.train else start + produced * spec.batch_size
        folder = Path(spec.rec_files[0]).parent
        fix = f"run 'imgpipe verify --decode {folder}', or use the torch loader with on_corrupt='skip'"
        found = first_undecodable(self._shards, range(first, end))
        if found is None:
            return DatasetError(f"DALI could not decode one of records {first} to {end - 1} of {folder} (Pillow decodes them all); {fix}")
        index, reason = found
        return DatasetError(f"cannot decode {self._shards.describe(index)}: {reason}; {fix}")

    def _make_iterator(self, epoch: int) -> Any:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        policy = LastBatchPolicy.DROP if self._spec.train else LastBatchPolicy.PARTIAL
        pipe = _build_pipeline(self._spec, epoch)
        return DALIGenericIterator([pipe], ["images", "labels"], reader_name=READER_NAME, last_batch_policy=policy)


def first_undecodable(shards: ShardSet, indices: Iterable[int]) -> tuple[int, str] | None:
    """The first of ``indices`` whose record does not read or decode whole, with the reason; None if all do."""
    from imgpipe.packing.codec import decode_failure

    for index in indices:
        try:
            reason = decode_failure(shards.read(index)[1])
        except ImgpipeError as e:
            reason = str(e)
        if reason is not None:
            return index, reason
    return None


def _build_pipeline(spec: _Spec, epoch: int) -> Any:
    dali = _import_dali()
    from nvidia.dali import fn, types

    from imgpipe.loaders.geometry import IMAGENET_MEAN, IMAGENET_STD

    seeds = epoch_seeds(spec.seed, spec.rank, epoch)
    gpu = spec.device_id is not None
    shard = (spec.rank + epoch) % spec.world_size if spec.train else spec.rank
    pipe = dali.Pipeline(
        batch_size=spec.batch_size,
        num_threads=spec.workers,
        device_id=spec.device_id,
        seed=seeds["pipeline"],
        prefetch_queue_depth=spec.prefetch,
    )
    with pipe:
        jpegs, labels = fn.readers.mxnet(
            path=list(spec.rec_files),
            index_path=[spec.index_file],
            shard_id=shard,
            num_shards=spec.world_size,
            random_shuffle=spec.train,
            initial_fill=spec.initial_fill,
            seed=seeds["reader"],
            pad_last_batch=True,
            stick_to_shard=True,
            name=READER_NAME,
        )
        decoder = "mixed" if gpu else "cpu"
        size = spec.image_size
        geometry = dali_geometry(size, spec.train)
        interp = getattr(types, geometry["interpolation"])
        if spec.train:
            images = fn.decoders.image_random_crop(
                jpegs,
                device=decoder,
                output_type=types.RGB,
                adjust_orientation=False,
                random_area=list(geometry["random_area"]),
                random_aspect_ratio=list(geometry["random_aspect_ratio"]),
                num_attempts=geometry["num_attempts"],
                seed=seeds["crop"],
            )
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=interp, antialias=geometry["antialias"])
            mirror = fn.random.coin_flip(probability=geometry["flip_probability"], seed=seeds["flip"])
            crop_pos = {}
        else:
            width, height, crop_x, crop_y = _eval_resize_and_crop(jpegs, geometry["resize_shorter"], size)
            images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB, adjust_orientation=False)
            images = fn.resize(images, resize_x=width, resize_y=height, interp_type=interp, antialias=geometry["antialias"])
            crop_pos = {"crop_pos_x": crop_x, "crop_pos_y": crop_y}
            mirror = 0
        normalize = {}
        if spec.normalize:
            normalize = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}  # 0-255 units
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT if spec.normalize else types.UINT8,
            output_layout="HWC" if spec.channels_last else "CHW",
            crop=(size, size),
            mirror=mirror,
            **crop_pos,
            **normalize,
        )
        pipe.set_outputs(images, labels.gpu() if gpu else labels)
    return pipe


def _eval_resize_and_crop(jpegs: Any, shorter: int, size: int) -> tuple[Any, Any, Any, Any]:
    """Per-sample resize target and crop position reproducing torchvision's Resize + CenterCrop arithmetic.

    ``fn.resize(resize_shorter=...)`` rounds the long side and ``crop_mirror_normalize``
    rounds the crop anchor half away from zero; torchvision (and so the torch loader,
    ``geometry.EvalGeometry.crop``) truncates the long side and rounds the anchor half to
    even. Off by one pixel, the two loaders would differ by 5-15 units on fine detail, so the
    exact sizes are computed here from the stored JPEG size with DALI arithmetic.
    """
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    shape = fn.cast(fn.peek_image_shape(jpegs, adjust_orientation=False), dtype=types.FLOAT)
    height, width = shape[0], shape[1]
    resized_long = dmath.floor(shorter * dmath.max(width, height) / dmath.min(width, height))
    portrait = fn.cast(width <= height, dtype=types.FLOAT)
    out_w = portrait * shorter + (1.0 - portrait) * resized_long
    out_h = portrait * resized_long + (1.0 - portrait) * shorter
    slack_x, slack_y = out_w - size, out_h - size
    crop_x = _round_half_even(slack_x * 0.5) / dmath.max(slack_x, 1.0)
    crop_y = _round_half_even(slack_y * 0.5) / dmath.max(slack_y, 1.0)
    return out_w, out_h, crop_x, crop_y


def _round_half_even(x: Any) -> Any:
    """Python's round() of a DALI float node holding whole or half values."""
    import nvidia.dali.math as dmath

    floor = dmath.floor(x)
    odd = floor - 2.0 * dmath.floor(floor * 0.5)
    return floor + 2.0 * (x - floor) * odd


def dali_geometry(image_size: int, train: bool) -> dict[str, Any]:
    """The DALI operator arguments of the geometry, all taken from ``imgpipe.loaders.geometry`` (shared with the torch loader).

    Train: ``decoders.image_random_crop(random_area, random_aspect_ratio, num_attempts)``,
    resize to ``crop`` squared, mirror with ``flip_probability``. Eval: resize the shorter side
    to ``resize_shorter`` then center-crop ``crop``, with torchvision's rounding. Both decode
    the stored pixels without EXIF rotation, as the torch loader does (``imgpipe pack``
    applies the orientation when packing). ``interpolation`` names a ``types`` member.
    """
    from imgpipe.loaders import geometry

    dali_interp = {"bilinear": "INTERP_LINEAR", "bicubic": "INTERP_CUBIC", "nearest": "INTERP_NN"}
    common = {"crop": image_size, "interpolation": dali_interp[geometry.INTERPOLATION], "antialias": geometry.ANTIALIAS}
    if not train:
        return {**common, "resize_shorter": geometry.EvalGeometry(image_size=image_size).resize_shorter}
    crop = geometry.TrainGeometry(image_size=image_size)
    return {
        **common,
        "random_area": crop.scale,
        "random_aspect_ratio": crop.ratio,
        "num_attempts": geometry.CROP_ATTEMPTS,
        "flip_probability": crop.flip_p,
    }


def make_dali_loader(
    path: str | os.PathLike | Sequence[str | os.PathLike] | ShardSet,
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
    initial_fill: int = DEFAULT_INITIAL_FILL,
    prefetch: int = 2,
    on_corrupt: str = "raise",
) -> DaliLoader:
    """A DALI loader over a packed folder (or bare .rec/.idx files) with the torch loader's contract.

    Yields ``(images, labels)``: images float32 NCHW normalized with ImageNet mean/std (uint8
    NCHW when ``normalize=False``) on ``device`` (CPU operators when None/"cpu", GPU decoding
    with ``mixed`` on a CUDA device; default: the current CUDA device if any, else the CPU); labels int64. ``workers`` is DALI's CPU thread count.
    ``len(loader)`` is this rank's batches per epoch; each ``iter()`` is the next epoch and
    ``set_epoch(e)`` picks one (see the module docstring for the train/eval policies).
    ``initial_fill``: the reader's shuffle buffer, in records; ``prefetch``: DALI's queue depth.
    ``on_corrupt``: only "raise" (a record DALI cannot decode stops the epoch with its shard,
    record and source); "skip" is the torch loader's.
    """
    _import_dali()
    args = check_loader_args(
        split=split, batch_size=batch_size, train=train, image_size=image_size, workers=workers, seed=seed, rank=rank,
        world_size=world_size, device=device, normalize=normalize, channels_last=channels_last,
    )
    initial_fill = check_int("initial_fill", initial_fill, minimum=1)
    prefetch = check_int("prefetch", prefetch, minimum=1)
    if check_choice("on_corrupt", on_corrupt, ON_CORRUPT) == "skip":
        raise ConfigError(
            "on_corrupt='skip' needs the torch loader: DALI decodes whole batches, so the DALI loader can only raise "
            "on a corrupt record (on_corrupt='raise')"
        )
    env, shards = open_for_rank(path, args)
    records = len(shards)
    if records < env.world_size:
        raise DatasetError(f"{path}: split {split!r} has {records} records, fewer than the {env.world_size} ranks")
    spec = _Spec(
        rec_files=tuple(str(p) for p in shards.rec_paths),
        index_file=str(write_dali_index(shards)),
        records=records,
        batch_size=args.batch_size,
        train=args.train,
        image_size=args.image_size,
        workers=max(1, args.workers if args.workers is not None else default_workers(env.local_world_size)),
        seed=args.seed,
        rank=env.rank,
        world_size=env.world_size,
        device_id=args.device.index if args.device.type == "cuda" else None,
        normalize=args.normalize,
        channels_last=args.channels_last,
        initial_fill=initial_fill,
        prefetch=prefetch,
    )
    loader = DaliLoader(spec, shards)
    if args.train and len(loader) == 0:
        raise no_full_batch(path, split, records, env.world_size, args.batch_size, "lower batch_size")
    return loader

