"""A run's checkpoint: what every rank contributes and rank 0 writes, and a run picked up again from one.

The file holds plain values only (``checkpoint_file.py``): the model, optimizer, scheduler, scaler and
EMA state, the position (epoch, step, the loader's place in the global stream), every rank's RNG
states, the global batch and the config. Resuming applies the config over the saved optimizer
(``resume.py`` converts the position to the config's global batch and grad_accum).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgpipe.train import checkpoint_file as ckpt
from imgpipe.train.config import TrainConfig
from imgpipe.train.metrics import gather_objects
from imgpipe.train.resume import changed_settings, resume_line, resume_position
from imgpipe.train.rundir import checkpoint_path
from imgpipe.train.stepping import Stepper

if TYPE_CHECKING:
    from imgpipe.train.data import TrainData
    from imgpipe.train.rank import RankContext

logger = logging.getLogger(__name__)


@dataclass
class RunState:
    epoch: int = 0  # the epoch being run
    epoch_step: int = 0  # optimizer steps done in it
    step: int = 0  # optimizer steps done in the whole run


@dataclass(frozen=True)
class Resumed:
    """Where a resumed run stands: its state, the loader state to load (None: from the epoch's start), the seconds run before."""

    state: RunState
    loader: dict[str, Any] | None
    wall_s: float


class RunCheckpoint:
    """Writes and reads ``<output.dir>/checkpoint.pt`` for one rank's run."""

    def __init__(
        self, ctx: RankContext, config: TrainConfig, stepper: Stepper, data: TrainData, num_classes: int, batch_request: dict[str, Any]
    ) -> None:
        self.ctx, self.config, self.stepper, self.data = ctx, config, stepper, data
        self.num_classes = num_classes
        self.batch_request = batch_request  # the batch the config asked for (see resume.resolve_batch)
        self.path = checkpoint_path(config.output.dir)

    def save(self, state: RunState, wall_s: float, stopping: bool = False) -> Path | None:
        """Every rank calls this at the same step (RNG states are gathered); rank 0 writes and returns the path."""
        rngs = gather_objects(ckpt.rng_state(self.ctx.device))
        if not self.ctx.is_main:
            return None
        parts = self.stepper.state_dict()
        saved = {
            "model": parts["model"],
            "optimizer": parts["optimizer"],
            "scheduler": parts["scheduler"],
            "scaler": parts["scaler"],
            "epoch": state.epoch,
            "epoch_step": state.epoch_step,
            "step": state.step,
            "loader": self.data.train.state_dict() if state.epoch_step else None,
            "rng": rngs,
            "world_size": self.ctx.world_size,
            "global_batch": self.config.train.batch_size * self.ctx.world_size,  # G: the loader stream's step
            "batch_request": self.batch_request,
            "num_classes": self.num_classes,
            "ema": parts["ema"],
            "wall_s": wall_s,
            "config": self.config.to_dict(),
        }
        path = ckpt.save_checkpoint(self.path, saved)
        logger.info("checkpoint: %s (epoch %d, step %d)%s", path, state.epoch, state.step, "; resume with --resume" if stopping else "")
        return path

    def resume(self, saved: dict[str, Any], steps_per_epoch: int) -> Resumed:
        """Load ``saved`` into the stepper and this process's RNGs; one line says where the run resumes and what changed."""
        self.stepper.load_model(saved, self.path, self.num_classes)
        position = resume_position(
            saved,
            self.config,
            global_batch=self.config.train.batch_size * self.ctx.world_size,
            steps_per_epoch=steps_per_epoch,
            records=self.data.train_records,
            path=self.path,
        )
        self.stepper.load_training_state(saved, position.step)
        rngs = saved["rng"]
        ckpt.set_rng_state(rngs[self.ctx.rank] if self.ctx.rank < len(rngs) else rngs[0], self.ctx.device)
        logger.info("resumed from %s at epoch %d, step %d", self.path, position.epoch, position.step)
        logger.info(
            "%s", resume_line(saved, self.ctx.world_size, self.config.train.batch_size, position, changed_settings(saved, self.config))
        )
        state = RunState(epoch=position.epoch, epoch_step=position.epoch_step, step=position.step)
        return Resumed(state, position.loader, float(saved.get("wall_s", 0.0)))
