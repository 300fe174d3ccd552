"""Resume on any rank count, with another batch size or grad_accum where the data stream allows it.

The loaders' global stream is one order of the records per (seed, epoch), whatever the global batch G,
so "r records of epoch e consumed" is a position in the stream of any G. The checkpoint's G is kept
unless the config asks for another batch; a new G or grad_accum applies where r is a whole number of
the new optimizer steps (always at an epoch end) and is refused in one line elsewhere. The step counter
is rewritten in the new steps, so the LR schedule stays where the epoch is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from imgpipe.errors import ConfigError
from imgpipe.loaders.sampler import batch_splits
from imgpipe.train import checkpoint_file as ckpt
from imgpipe.train.config import TrainConfig
from imgpipe.train.rundir import checkpoint_path


@dataclass(frozen=True)
class Position:
    """Where a resumed run stands, in its own optimizer steps."""

    epoch: int
    epoch_step: int  # optimizer steps done in the epoch
    step: int  # optimizer steps done in the run
    loader: dict[str, Any] | None  # the train loader's state to load; None: the epoch starts from its beginning


def checkpoint_to_resume(config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint ``output.resume`` asks for (false: None; auto: None when there is none yet)."""
    path = checkpoint_path(config.output.dir)
    if not config.output.resumes(path.exists()):
        return None
    return ckpt.load_checkpoint(path)


def saved_global_batch(saved: dict[str, Any]) -> int:
    """G of a checkpoint: stored since resume-anywhere, else its per-rank batch x its world size."""
    if "global_batch" in saved:
        return int(saved["global_batch"])
    return int(saved["config"]["train"]["batch_size"]) * int(saved["world_size"])


def batch_request(config: TrainConfig) -> dict[str, int | None]:
    """The batch a config asks for, before resuming resolves it (kept in the checkpoint to tell a change from a stale file)."""
    return {"batch_size": config.train.batch_size, "global_batch_size": config.train.global_batch_size}


def resolve_batch(config: TrainConfig, world_size: int, saved: dict[str, Any] | None) -> TrainConfig:
    """``config`` with the global batch G as ``train.global_batch_size`` and ``train.batch_size`` = G / world size.

    G is the checkpoint's, unless the config's batch request differs from the one the checkpoint's
    run was given (then ``train.global_batch_size``, else ``train.batch_size`` x world size); without
    a checkpoint, ``train.global_batch_size``, else ``train.batch_size`` x world size. The saved
    config holds G, so resuming from it keeps G whatever the rank count.
    """
    wanted = config.train.global_batch_size
    if saved is not None:
        global_batch = _requested_global_batch(config, world_size, saved) or saved_global_batch(saved)
    else:
        global_batch = wanted if wanted is not None else config.train.batch_size * world_size
    if global_batch % world_size:
        where = "train.global_batch_size" if wanted == global_batch else "the checkpoint's"  # batch_size x ranks always splits
        raise ConfigError(
            f"{where} global batch {global_batch} does not split over {world_size} ranks; run on a rank count that divides it "
            f"(per-rank batch {batch_splits(global_batch)})"
        )
    train = config.train.model_copy(update={"batch_size": global_batch // world_size, "global_batch_size": global_batch})
    return config.model_copy(update={"train": train})


def _requested_global_batch(config: TrainConfig, world_size: int, saved: dict[str, Any]) -> int | None:
    """The G the config asks for instead of the checkpoint's, or None to keep the checkpoint's.

    The config file a run resumes with usually still holds the batch the run was started with,
    also after a resume on another rank count changed the per-rank batch: only a request that
    differs from the one stored in the checkpoint is a change. Checkpoints written before the
    request was stored: only ``train.global_batch_size`` can change G.
    """
    wanted = config.train.global_batch_size
    given = saved.get("batch_request")
    if given is None:
        return wanted if wanted is not None and wanted != saved_global_batch(saved) else None
    if batch_request(config) == given:
        return None
    return wanted if wanted is not None else config.train.batch_size * world_size


def resume_position(
    saved: dict[str, Any], config: TrainConfig, *, global_batch: int, steps_per_epoch: int, records: int, path: object
) -> Position:
    """The checkpoint's position in optimizer steps of ``global_batch`` x ``config.train.grad_accum`` records.

    ``records``: the train split's size, to check a mid-epoch position against. A ConfigError
    when the position is not in this config's data stream, or not on one of its step boundaries.
    """
    epoch, epoch_step, step = int(saved["epoch"]), int(saved["epoch_step"]), int(saved["step"])
    loader = saved.get("loader")
    if loader is not None:
        _check_same_stream(loader, config, records, epoch, path)
    was_global, was_accum = saved_global_batch(saved), saved_grad_accum(saved)
    accum = config.train.grad_accum
    if (was_global, was_accum) == (global_batch, accum):
        return Position(epoch, epoch_step, step, loader)
    consumed = int(loader["batches"]) * was_global if loader is not None else 0  # records of the epoch already trained on
    per_step = global_batch * accum
    if consumed % per_step:
        epoch_end = step + records // was_global // was_accum - epoch_step
        raise ConfigError(
            f"{path}: cannot resume with global batch {global_batch} x train.grad_accum {accum} = {per_step} records per step: "
            f"the checkpoint stopped in epoch {epoch} after {consumed} records, and {per_step} does not divide {consumed} "
            f"(global batch {was_global} x grad_accum {was_accum} when saved); resume as saved to the end of the epoch "
            f"(train.max_steps: {epoch_end}) and change them there, or pick a global batch x grad_accum that divides {consumed}"
        )
    epoch_step = consumed // per_step
    if loader is not None:
        loader = {**loader, "batches": consumed // global_batch, "global_batch": global_batch}
    return Position(epoch, epoch_step, epoch * steps_per_epoch + epoch_step, loader)


def saved_grad_accum(saved: dict[str, Any]) -> int:
    return int(saved.get("config", {}).get("train", {}).get("grad_accum", 1))


def _check_same_stream(loader: dict[str, Any], config: TrainConfig, records: int, epoch: int, path: object) -> None:
    """A mid-epoch position is one in the order of (seed, records): the config must give the same."""
    seed = loader.get("seed", config.train.seed)
    if seed != config.train.seed:
        raise ConfigError(
            f"{path}: the checkpoint stopped in epoch {epoch}, in the record order of train.seed {seed}, but train.seed is "
            f"{config.train.seed}; resume with train.seed: {seed} (a new seed can start at an epoch end), or train into another output.dir"
        )
    saved_records = loader.get("records", records)
    if saved_records != records:
        raise ConfigError(
            f"{path}: the checkpoint stopped in epoch {epoch} of a train split of {saved_records} records, but split "
            f"{config.data.train_split!r} of {config.data.path} has {records}; resume with the data it was trained on "
            "(data.path, data.train_split), or train into another output.dir"
        )


def changed_settings(saved: dict[str, Any], config: TrainConfig) -> list[str]:
    """``key old -> new`` for each setting of ``optim`` and ``train`` that differs from the checkpoint's run (batch sizes aside)."""
    before = saved.get("config", {})
    after = config.to_dict()
    changes = []
    for section in ("optim", "train"):
        for key, value in after[section].items():
            old = before.get(section, {}).get(key, value)
            if key not in ("batch_size", "global_batch_size") and old != value:
                changes.append(f"{section}.{key} {old} -> {value}")
    return changes


def resume_line(saved: dict[str, Any], world_size: int, batch_size: int, position: Position | None = None, changes: list[str] = ()) -> str:
    """What the resumed run continues from, and what changed.

    For example ``resumed at epoch 3, global batch 120, on 3 ranks (was 2); per-rank batch 4 (was 6)``.

    ``global batch N`` is the position: global batches of the epoch already consumed.
    """
    loader = (position.loader if position is not None else saved.get("loader")) or {}
    was_world = int(saved["world_size"])
    was_batch = saved_global_batch(saved) // was_world
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}" + (f" (was {was_world})" if was_world != world_size else "")
    batch = f"per-rank batch {batch_size}" + (f" (was {was_batch})" if was_batch != batch_size else "")
    line = f"resumed at epoch {int(saved['epoch'])}, global batch {int(loader.get('batches', 0))}, on {ranks}; {batch}"
    global_batch = batch_size * world_size
    if global_batch != saved_global_batch(saved):
        line += f"; global batch size {global_batch} (was {saved_global_batch(saved)})"
    if changes:
        line += f"; from the config: {', '.join(changes)}"
    return line
