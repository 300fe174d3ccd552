"""NVIDIA DALI loader fed by imgpipe: the torch loader's records, order, crops and state, decoded by DALI.

``nvidia.dali`` is imported here only, lazily, so imgpipe works without it installed. The
``EpochSampler`` picks each batch's records as for the torch loader, and an external source
(``dali_feed.DaliFeed``, a thread two batches ahead) hands DALI each record's bytes, window, crop and
flip. DALI decodes only the window, resizes it to the batch's size, mirrors and normalizes it, and draws
no random numbers: labels equal the torch loader's and pixels differ only by the resize filter. The
pipeline is built once and reused from epoch to epoch (rebuilt after an epoch left unfinished).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from imgpipe.distenv import DistEnv
from imgpipe.errors import ConfigError, DatasetError, ImgpipeError
from imgpipe.format.shardset import ShardSet
from imgpipe.loaders.base import SampledLoader
from imgpipe.loaders.common import RankStream, default_workers, open_rank_stream
from imgpipe.loaders.dali_feed import FEED_NAMES, UNDECODABLE_FIX, DaliFeed
from imgpipe.loaders.geometry import EVAL_CROP_FRACTION
from imgpipe.loaders.options import CURRENT_DEVICE, DEFAULT_PREFETCH_FACTOR, LoaderOptions, check_int

INSTALL_HINT = "pip install 'imgpipe[dali]'"


class _Default(int):
    """A default value, told apart from the same value given (``prefetch_factor=2`` beside the deprecated ``prefetch``)."""


_DEFAULT_PREFETCH = _Default(DEFAULT_PREFETCH_FACTOR)
_DECODING_OPERATORS = ("decoders", "ImageSlice")  # in DALI's message when a record did not decode


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
    """What the pipeline is built from."""

    batch_size: int
    image_size: int
    workers: int
    device_id: int | None
    normalize: bool
    channels_last: bool
    prefetch_factor: int


class DaliLoader(SampledLoader):
    """Iterable of ``(images, labels)`` batches for this rank; each ``iter()`` is the next epoch."""

    def __init__(self, options: LoaderOptions, stream: RankStream) -> None:
        super().__init__(stream.sampler, stream.env, follow_world=options.rank is None)
        self.options = options
        self.shards = stream.shards
        self.device = options.device
        self._spec = _Spec(
            batch_size=options.batch_size,
            image_size=options.image_size,
            workers=dali_threads(options.workers, stream.env),
            device_id=self.device.index if self.device.type == "cuda" else None,
            normalize=options.normalize,
            channels_last=options.channels_last,
            prefetch_factor=options.prefetch_factor,
        )
        self._feed = DaliFeed(stream.shards, stream.geometry, options.seed)
        self._pipe: Any = None
        self._reusable = False  # the pipeline handed over every batch of its last epoch
        self.skipped = 0  # DALI never replaces a record: a corrupt one stops the epoch with a DatasetError

    def _shut_down(self) -> None:
        """Drop the DALI pipeline (its threads end with it) and stop the feed's read-ahead thread."""
        self._pipe = None
        self._feed.close()

    def _moved(self, env: DistEnv) -> None:
        spec = replace(self._spec, workers=dali_threads(self.options.workers, env))
        if spec != self._spec:
            self._spec, self._pipe = spec, None

    def _batches(self, epoch: int, batches: list[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not batches:
            return
        feed = self._feed
        feed.start(epoch, batches, self.sampler.resolution)
        pipe = self._pipeline()
        self._reusable = False
        for remaining in range(len(batches) - 1, -1, -1):
            try:
                (images,) = pipe.run()
            except RuntimeError as e:
                self._pipe = None  # DALI's pipeline is unusable after an error
                raise self._decode_error(e) from None
            indices = feed.fed.popleft()
            labels = torch.from_numpy(self.shards.labels[indices].astype(np.int64)).to(self.device, non_blocking=True)
            self.sampler.mark_consumed()
            # the last batch is out: the pipeline holds no work of this pass, so the next one resets
            # and reuses it, whether or not the consumer asks for more (a loop that stops after
            # len(loader) batches, as the trainer's does, consumed every batch)
            self._reusable = remaining == 0
            yield self._to_torch(images), labels

    def _pipeline(self) -> Any:
        """The pipeline, reset for a new epoch; a new one when the last epoch was left before its last batch."""
        if self._pipe is not None and self._reusable:
            self._pipe.reset()
        else:
            self._pipe = _build_pipeline(self._spec, self._feed)
            self._pipe.build()
        return self._pipe

    def _to_torch(self, images: Any) -> torch.Tensor:
        """DALI's batch as a torch tensor on the loader's device (NCHW, or a channels_last view of HWC) that the caller owns.

        DALI's dynamic executor (the default since DALI 2.0) gives every iteration buffers of its
        own, kept alive by whoever holds them, so the batch is shared through DLPack without a
        copy, as ``DALIGenericIterator`` does; older executors reuse their buffers, so it is copied.
        Copying a float32 batch of 64 at 224 px cost this loader a fifth of its throughput on 2 CPUs.
        """
        tensor = images.as_tensor()
        if getattr(self._pipe, "exec_dynamic", False):
            with self.device:
                out = torch.from_dlpack(tensor)
        else:
            from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

            out = torch.empty(tensor.shape(), dtype=to_torch_type[tensor.dtype], device=self.device)
            stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
            feed_ndarray(tensor, out, cuda_stream=stream)
        return out.permute(0, 3, 1, 2) if self._spec.channels_last else out

    def _decode_error(self, error: RuntimeError) -> Exception:
        """A DALI decoder failure as the torch loader's one-line DatasetError (shard, record, source); anything else unchanged.

        DALI's message does not say which record failed: the records of the batches in flight are
        checked with Pillow, as ``imgpipe verify --decode`` does.
        """
        if not any(op in str(error) for op in _DECODING_OPERATORS):
            return error
        indices = [int(i) for batch in self._feed.fed for i in batch]
        fix = UNDECODABLE_FIX
        found = first_undecodable(self.shards, indices)
        if found is None:
            return DatasetError(
                f"DALI could not decode one of records {', '.join(map(str, indices))} of {self.shards!r} (Pillow decodes them all); {fix}"
            )
        index, reason = found
        return DatasetError(f"cannot decode {self.shards.describe(index)}: {reason}; {fix}")


def first_undecodable(shards: ShardSet, indices: Iterable[int]) -> tuple[int, str] | None:
    """The first of ``indices`` whose record does not read or decode whole, with the reason; None if all do."""
    from imgpipe.image.codec import decode_failure

    for index in indices:
        try:
            reason = decode_failure(shards.read(index)[1])
        except ImgpipeError as e:
            reason = str(e)
        if reason is not None:
            return index, reason
    return None


def _build_pipeline(spec: _Spec, feed: DaliFeed) -> Any:
    dali = _import_dali()
    from nvidia.dali import fn, types

    from imgpipe.loaders.geometry import IMAGENET_MEAN, IMAGENET_STD

    geometry = dali_geometry(spec.image_size, train=True)
    pipe = dali.Pipeline(
        batch_size=spec.batch_size, num_threads=spec.workers, device_id=spec.device_id, prefetch_queue_depth=spec.prefetch_factor
    )
    with pipe:
        jpegs, anchor, shape, roi_start, roi_end, mirror, size = fn.external_source(source=feed, num_outputs=len(FEED_NAMES), batch=True)
        images = fn.decoders.image_slice(
            jpegs,
            anchor,
            shape,
            device="mixed" if spec.device_id is not None else "cpu",
            normalized_anchor=False,
            normalized_shape=False,
            axis_names="WH",
            output_type=types.RGB,
            adjust_orientation=False,  # the stored pixels, as the torch loader decodes them (pack applied EXIF)
        )
        images = fn.resize(
            images,
            size=size,
            roi_start=roi_start,
            roi_end=roi_end,
            roi_relative=False,
            interp_type=getattr(types, geometry["interpolation"]),
            antialias=geometry["antialias"],
        )
        normalize = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)} if spec.normalize else {}  # 0-255 units
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT if spec.normalize else types.UINT8,
            output_layout="HWC" if spec.channels_last else "CHW",
            mirror=mirror,
            **normalize,
        )
        pipe.set_outputs(images)
    return pipe


def dali_geometry(image_size: int, train: bool) -> dict[str, Any]:
    """The DALI operator arguments of the geometry, all taken from ``imgpipe.loaders.geometry`` (shared with the torch loader).

    The loader takes ``interpolation`` and ``antialias`` (imgpipe draws the crops itself); the
    rest is what a plain DALI pipeline passes for the same geometry. Train:
    ``decoders.image_random_crop(random_area, random_aspect_ratio, num_attempts)``, resize to
    ``crop`` squared, mirror with ``flip_probability``. Eval: resize the shorter side to
    ``resize_shorter`` then center-crop ``crop``. Both decode
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
    crop_ratio: float = EVAL_CROP_FRACTION,
    remainder: str = "drop",
    shuffle: bool | None = None,
    block_shuffle: int | None = None,
    shuffle_window: int | None = None,
    prefetch_factor: int = _DEFAULT_PREFETCH,
    on_corrupt: str = "raise",
    cache_dir: str | os.PathLike | None = None,
    prefetch: int | None = None,
) -> DaliLoader:
    """A DALI loader over a packed folder (or bare .rec/.idx files) with the torch loader's records, crops and state.

    Yields ``(images, labels)``: images float32 NCHW normalized with ImageNet mean/std (uint8
    NCHW when ``normalize=False``) on ``device`` (CPU operators when None/"cpu", ``mixed``
    decoding on a CUDA device; default: the current CUDA device if any, else the CPU); labels
    int64. ``loader.set_resolution(px)`` changes the output size from the next ``iter()`` on, as the
    torch loader's; ``crop_ratio`` (eval): the center crop's share of the shorter side (224/256).
    ``workers`` is DALI's CPU thread count. ``remainder``, ``shuffle``, ``block_shuffle``,
    ``shuffle_window``: as the torch loader's. ``prefetch_factor``: the batches DALI prepares ahead
    (its queue depth); ``prefetch`` is its deprecated name. ``on_corrupt``: only "raise" (a record
    DALI cannot decode stops the epoch with its shard, record and source); "skip" is the torch
    loader's. ``cache_dir``: as the torch loader's.
    """
    _import_dali()
    arguments = {name: value for name, value in locals().items() if name not in ("path", "prefetch")}
    if prefetch is not None:
        if prefetch_factor is not _DEFAULT_PREFETCH:
            raise ConfigError("prefetch is the deprecated name of prefetch_factor: give prefetch_factor alone")
        warnings.warn("make_dali_loader's prefetch is deprecated: call it prefetch_factor, as the torch loader does", DeprecationWarning, 2)
        arguments["prefetch_factor"] = check_int("prefetch", prefetch, minimum=1)
    options = LoaderOptions(**arguments)
    if options.on_corrupt == "skip":
        raise ConfigError(
            "on_corrupt='skip' needs the torch loader: DALI decodes whole batches, so the DALI loader can only raise "
            "on a corrupt record (on_corrupt='raise')"
        )
    return DaliLoader(options, open_rank_stream(path, options))


def dali_threads(workers: int | None, env: DistEnv) -> int:
    """DALI's CPU thread count: ``workers``, else ``default_workers()`` for ``env``'s node; at least 1."""
    return max(1, default_workers(env.local_world_size) if workers is None else workers)
