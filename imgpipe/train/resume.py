"""Resume on any rank count: the checkpoint's global batch G fixes the per-rank batch, G / world size.

The loaders' global stream (``imgpipe.loaders.sampler``) depends only on (seed, epoch, G), so a run
saved on 2 ranks continues the very same stream on 3 as long as every rank reads G / 3
records per step. The LR schedule counts optimizer steps, which are global steps, and the
steps per epoch stay ``records // G``: both carry over unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from imgpipe.errors import ConfigError
from imgpipe.loaders.sampler import batch_splits
from imgpipe.train import checkpoint as ckpt
from imgpipe.train.config import TrainConfig


def checkpoint_to_resume(config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint ``output.resume`` asks for (``no``: None; ``auto``: None when there is none yet)."""
    path = ckpt.checkpoint_path(config.output.dir)
    if config.output.resume == "no" or (config.output.resume == "auto" and not path.exists()):
        return None
    return ckpt.load_checkpoint(path)


def saved_global_batch(saved: dict[str, Any]) -> int:
    """G of a checkpoint: stored since resume-anywhere, else its per-rank batch x its world size."""
    if "global_batch" in saved:
        return int(saved["global_batch"])
    return int(saved["config"]["train"]["batch_size"]) * int(saved["world_size"])


def resolve_batch(config: TrainConfig, world_size: int, saved: dict[str, Any] | None) -> TrainConfig:
    """``config`` with ``train.batch_size`` per rank: G / world size, G from the checkpoint, else ``train.global_batch_size``.

    Without either, ``train.batch_size`` stays as given (G = batch_size x world size).
    """
    wanted = config.train.global_batch_size
    if saved is not None:
        global_batch = saved_global_batch(saved)
        if wanted is not None and wanted != global_batch:
            raise ConfigError(
                f"train.global_batch_size is {wanted} but the checkpoint in {config.output.dir} was trained with global batch "
                f"{global_batch}; resume with train.global_batch_size: {global_batch} (or null), or train into another output.dir"
            )
    elif wanted is not None:
        global_batch = wanted
    else:
        return config
    if global_batch % world_size:
        where = "the checkpoint's" if saved is not None else "train.global_batch_size"
        raise ConfigError(
            f"{where} global batch {global_batch} does not split over {world_size} ranks; run on a rank count that divides it "
            f"(per-rank batch {batch_splits(global_batch)})"
        )
    return dataclasses.replace(config, train=dataclasses.replace(config.train, batch_size=global_batch // world_size))


def resume_line(saved: dict[str, Any], world_size: int, batch_size: int) -> str:
    """What the resumed run continues from, and what changed, e.g. ``resumed at epoch 3, global batch 120, on 3 ranks (was 2); per-rank batch 4 (was 6)``."""
    loader = saved.get("loader") or {}
    was_world = int(saved["world_size"])
    was_batch = saved_global_batch(saved) // was_world
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}" + (f" (was {was_world})" if was_world != world_size else "")
    batch = f"per-rank batch {batch_size}" + (f" (was {was_batch})" if was_batch != batch_size else "")
    return f"resumed at epoch {int(saved['epoch'])}, global batch {int(loader.get('batches', 0))}, on {ranks}; {batch}"
