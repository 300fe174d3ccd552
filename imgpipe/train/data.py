"""The trainer's data: train/val loaders for a config (torch, DALI, or synthetic in-memory batches).

``synthetic`` serves one fixed random batch from device memory, as many times per epoch as
the real train split would give: training on it measures the compute ceiling, with no
decoding and no data wait, to compare the real loaders against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from imgpipe.errors import ConfigError, DatasetError
from imgpipe.format.manifest import Manifest, load_manifest
from imgpipe.loaders.base import Loader
from imgpipe.loaders.sampler import batch_count
from imgpipe.train.config import TrainConfig
from imgpipe.train.rank import RankContext
from imgpipe.train.resolution import parse_resolution


@dataclass
class TrainData:
    """The loaders of one rank plus what the trainer needs to know about the dataset."""

    train: Loader
    val: Loader | None
    classes: list[str]
    train_records: int
    val_records: int


def build_data(config: TrainConfig, ctx: RankContext) -> TrainData:
    """Open the manifest and build this rank's loaders as the config says."""
    if not config.data.path:
        raise ConfigError("data.path is not set: point it at a folder made by 'imgpipe pack' (--set data.path=DIR)")
    location = config.data.location
    manifest = load_manifest(location)
    if config.data.train_split not in manifest.splits:
        raise DatasetError(
            f"{location}: no split {config.data.train_split!r} (has {', '.join(sorted(manifest.splits))}); set data.train_split"
        )
    val_split = config.data.val_split if config.train.validate and config.data.backend != "synthetic" else ""
    if val_split and val_split not in manifest.splits:
        raise DatasetError(
            f"{location}: no split {val_split!r} to validate on (has {', '.join(sorted(manifest.splits))}); "
            "set data.val_split to one of them, or train.validate: false"
        )
    _check_one_batch(config, manifest.splits[config.data.train_split].records, ctx.world_size)
    kwargs = loader_kwargs(config, ctx)
    backend = config.data.backend
    sizes = parse_resolution(config.data.resolution, config.data.image_size).distinct(config.train.epochs)
    if backend == "synthetic":
        train = SyntheticBatches(manifest, config, ctx)
        val = None
    else:
        make = _loader_factory(backend)
        ring = {"max_image_size": max(sizes)} if backend == "torch" else {}  # the ring holds the ramp's largest size from the start
        prefetch = {"prefetch_factor": config.data.prefetch_factor} if backend == "torch" else {}  # DALI reads ahead by its own rule
        train = make(
            location,
            config.data.train_split,
            batch_size=config.train.batch_size,
            train=True,
            image_size=sizes[0],
            **ring,
            **prefetch,
            **kwargs,
        )
        val = (
            make(
                location,
                val_split,
                batch_size=config.train.batch_size,
                train=False,
                image_size=config.data.val_image_size or config.data.image_size,
                crop_ratio=config.data.val_crop_ratio,
                **prefetch,
                **kwargs,
            )
            if val_split
            else None
        )
    val_records = manifest.splits[val_split].records if val_split else 0
    return TrainData(train, val, list(manifest.classes), manifest.splits[config.data.train_split].records, val_records)


def _check_one_batch(config: TrainConfig, records: int, world_size: int) -> None:
    """The train split must fill one global batch: the trainer drops the remainder (the loaders' own message names their arguments)."""
    global_batch = config.train.batch_size * world_size
    if records >= global_batch:
        return
    fix = f"lower train.batch_size to {records // world_size} or less" if records >= world_size else f"run on at most {records} ranks"
    raise DatasetError(
        f"{config.data.path}: split {config.data.train_split!r} has {records} records, fewer than one global batch of {global_batch} "
        f"(train.batch_size {config.train.batch_size} x {world_size} rank(s)); {fix} (with train.global_batch_size: that over the ranks)"
    )


def loader_kwargs(config: TrainConfig, ctx: RankContext) -> dict[str, Any]:
    """What the trainer gives either loader factory besides the path, split, batch size, train flag and sizes."""
    return dict(
        workers=config.data.workers,
        seed=config.train.seed,
        rank=ctx.rank,
        world_size=ctx.world_size,
        device=ctx.device,
        normalize=True,
        channels_last=config.train.channels_last,
        cache_dir=config.data.cache or None,
    )


def _loader_factory(backend: str) -> Any:
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader

        return make_torch_loader
    if backend == "dali":
        from imgpipe.loaders.dali import make_dali_loader

        return make_dali_loader
    raise ConfigError(f"data.backend must be torch, dali or synthetic, got {backend!r}")


class SyntheticBatches:
    """One random batch kept on the device, yielded ``len(self)`` times per epoch (the compute ceiling)."""

    def __init__(self, manifest: Manifest, config: TrainConfig, ctx: RankContext) -> None:
        records = manifest.splits[config.data.train_split].records
        self.batches = batch_count(
            records, rank=ctx.rank, world_size=ctx.world_size, batch_size=config.train.batch_size
        )  # >= 1: build_data checked
        self._generator = torch.Generator().manual_seed(config.train.seed + ctx.rank)
        self._device, self._channels_last, self._n = ctx.device, bool(config.train.channels_last), config.train.batch_size
        self.labels = torch.randint(0, len(manifest.classes), (self._n,), generator=self._generator).to(ctx.device)
        self.resolution = 0
        self.set_resolution(config.data.image_size)
        self.epoch = 0
        self.skipped = 0
        self._start = 0
        self._consumed = 0

    def __len__(self) -> int:
        return self.batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._start = epoch, 0

    def set_resolution(self, px: int) -> None:
        """A new random batch of ``px`` x ``px`` images (the same batch while the size stays)."""
        if px == self.resolution:
            return
        images = torch.randn(self._n, 3, px, px, generator=self._generator).to(self._device)
        self.images = images.contiguous(memory_format=torch.channels_last) if self._channels_last else images
        self.resolution = px

    @property
    def last_records(self) -> np.ndarray:
        """The "records" of the one batch: 0 .. batch_size - 1."""
        return np.arange(self._n)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches": self._consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self._start = int(state["epoch"]), int(state["batches"])

    def close(self) -> None:
        """Nothing to stop: the batch lives on the device."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._consumed = self._start
        for _ in range(self._start, self.batches):
            self._consumed += 1
            yield self.images, self.labels
        self._start = 0
