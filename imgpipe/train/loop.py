"""One rank's training run: the epoch loop, and the decisions every rank takes at the same step.

Every rank runs :func:`train_rank`. A stop on a signal, a checkpoint and the end of an epoch are
agreed at the same optimizer step on every rank; only rank 0 prints, logs and writes files. The
parts: the model and optimizer (``stepping``), validation, the metrics and TensorBoard
(``runlog``), the checkpoint (``run_checkpoint``), and the one-line failures (``failures``).
"""

from __future__ import annotations

import logging
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from imgpipe.errors import ConfigError
from imgpipe.train.config import TrainConfig, save_config
from imgpipe.train.data import TrainData, build_data
from imgpipe.train.failures import explain_failure
from imgpipe.train.metrics import StepTimer, gather_summaries, global_images_per_s, imbalance
from imgpipe.train.mixing import Mixing
from imgpipe.train.models import check_model_name
from imgpipe.train.precision import describe, resolve_auto
from imgpipe.train.process_state import run_scope
from imgpipe.train.rank import RankContext
from imgpipe.train.resolution import parse_resolution, val_image_size
from imgpipe.train.resume import batch_request, checkpoint_to_resume, resolve_batch
from imgpipe.train.run_checkpoint import RunCheckpoint, RunState
from imgpipe.train.runlog import RunLog, target_line
from imgpipe.train.stepping import Stepper
from imgpipe.train.stopping import stop_requested
from imgpipe.train.validation import validate

logger = logging.getLogger(__name__)

STOP_CHECK_STEPS = 8  # optimizer steps between the ranks' agreements on a stop signal


@dataclass
class TrainResult:
    """What a run did: rank 0's view (all metrics are all-reduced over the ranks)."""

    output_dir: str
    epochs_completed: int
    step: int
    train_loss: list[float] = field(default_factory=list)  # per epoch
    train_top1: list[float] = field(default_factory=list)
    val_top1: float | None = None
    val_topk: float | None = None  # top-k accuracy, k = topk
    topk: int = 5  # min(5, classes)
    val_samples: int = 0
    ema_val_top1: float | None = None  # the EMA weights' (train.ema)
    wall_s: float = 0.0  # since the run started, over every resumed part of it
    target: dict[str, Any] | None = None  # train.target_top1 reached: {"epoch", "wall_s", "top1", "weights": "live"|"ema"}
    images_per_s: float = 0.0
    imbalance: float = 1.0
    stopped_by: str | None = None  # "SIGTERM"/"SIGINT" when a signal stopped the run
    checkpoint: str | None = None


def train_rank(ctx: RankContext, config: TrainConfig) -> TrainResult | None:
    """Train as this rank (``launch(train_rank, config, ...)``); rank 0 returns the TrainResult, others None.

    What the run sets in this process (signal handlers, warning filters, torch flags) is undone when it returns.
    """
    with run_scope(deterministic=config.train.deterministic, device=ctx.device, is_main=ctx.is_main):
        return _run_rank(ctx, config)


def _run_rank(ctx: RankContext, config: TrainConfig) -> TrainResult | None:
    config = resolve_auto(config, ctx.device)  # from here on, and in the saved config: what runs
    check_model_name(config.model.name)
    _seed_everything(config.train.seed, ctx.rank)
    saved = checkpoint_to_resume(config)
    request = batch_request(config)
    config = resolve_batch(config, ctx.world_size, saved)  # the per-rank batch that keeps (or changes) the global batch
    data = build_data(config, ctx)
    num_classes = config.model.num_classes or len(data.classes)
    if num_classes < len(data.classes):  # a label >= classes: an IndexError on the CPU, a device-side assert on a GPU
        raise ConfigError(
            f"model.num_classes {num_classes} is less than the {len(data.classes)} classes of {config.data.path} "
            f"(labels 0-{len(data.classes) - 1}); "
            f"set it to at least {len(data.classes)}, or to null to take the count from the manifest"
        )
    run: _Run | None = None
    try:
        run = _Run(ctx, config, data, num_classes, saved, request)
        result = run.fit()
        return result if ctx.is_main else None
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError too
        explained = explain_failure(e, ctx, config)
        if explained is None:
            raise
        raise explained from None
    finally:
        if run is not None:
            run.log.close()


class _Run:
    """The epoch loop of one run, over its parts: the stepper, the run log and the checkpoint."""

    def __init__(
        self,
        ctx: RankContext,
        config: TrainConfig,
        data: TrainData,
        num_classes: int,
        saved: dict[str, Any] | None,
        request: dict[str, Any],
    ) -> None:
        self.ctx, self.config, self.data, self.num_classes = ctx, config, data, num_classes
        accum = config.train.grad_accum
        self.steps_per_epoch = len(data.train) // accum
        if self.steps_per_epoch == 0:
            raise ConfigError(f"train.grad_accum {accum} is more than the {len(data.train)} batches per epoch of each rank")
        self.resolutions = parse_resolution(config.data.resolution, config.data.image_size)
        self.mixing = Mixing(config.train.mixup_alpha, config.train.cutmix_alpha, config.train.seed)
        if self.mixing.enabled and config.train.batch_size % 2:
            raise ConfigError(
                f"train.mixup_alpha/train.cutmix_alpha mix each sample with its neighbour in the global batch, so the per-rank "
                f"batch must be even, not {config.train.batch_size}; change train.batch_size or train.global_batch_size"
            )
        self.stepper = Stepper(config, ctx, num_classes, self.steps_per_epoch)
        self.state = RunState()
        self.timer = StepTimer(ctx.device)
        out = Path(config.output.dir)
        self.log = RunLog(out, enabled=ctx.is_main, tensorboard=config.output.tensorboard)
        self.checkpoint = RunCheckpoint(ctx, config, self.stepper, data, num_classes, request)
        self.result = TrainResult(output_dir=str(out), epochs_completed=0, step=0, topk=self.stepper.topk)
        self._saved = saved  # the checkpoint to resume from
        self._resume_loader: dict[str, Any] | None = None
        self._saved_step = -1
        self._started = time.perf_counter()  # wall_s counts from here, plus what the resumed checkpoint had run
        self._wall_before = 0.0
        if ctx.is_main:
            save_config(config, out)
            logger.info(
                "training %s on %d rank(s) (%s, %s%s): %d steps/epoch, global batch %d, lr %.4g, train at %s px, validate at %d px",
                config.model.name,
                ctx.world_size,
                ctx.device,
                describe(config),
                ", compiled" if config.train.compile else "",
                self.steps_per_epoch,
                self.stepper.global_batch,
                config.optim.base_lr * self.stepper.global_batch / 256,
                "-".join(map(str, self.resolutions.distinct(config.train.epochs))),
                val_image_size(config),
            )

    def fit(self) -> TrainResult:
        if self._saved is not None:
            resumed = self.checkpoint.resume(self._saved, self.steps_per_epoch)
            self._saved = None
            self.state, self._resume_loader, self._wall_before = resumed.state, resumed.loader, resumed.wall_s
        every_epochs = self.config.output.checkpoint_every_epochs
        while self.state.epoch < self.config.train.epochs:
            stop, totals = self._train_epoch()
            if self.state.epoch_step == self.steps_per_epoch:
                self._end_of_epoch(totals)
                self.state.epoch, self.state.epoch_step = self.state.epoch + 1, 0
                stop = stop or self.result.target is not None
                if not stop and every_epochs and self.state.epoch % every_epochs == 0:
                    self._save()
            if stop:
                break
        if self._saved_step != self.state.step:
            self._save(stopping=self.result.stopped_by is not None)
        self.result.step = self.state.step
        self.result.epochs_completed = self.state.epoch
        self.result.wall_s = self._wall_s()
        return self.result

    def _wall_s(self) -> float:
        """Seconds of training since the run started, the parts before a resume included."""
        return self._wall_before + time.perf_counter() - self._started

    def _train_epoch(self) -> tuple[bool, torch.Tensor]:
        """Run (the rest of) one epoch; (stop now? (signal or max_steps), this rank's [loss sum, top-1, top-k, samples])."""
        state, accum = self.state, self.stepper.accum
        totals = torch.zeros(4, dtype=torch.float64, device=self.ctx.device)
        micro_total = self.steps_per_epoch * accum
        micro = state.epoch_step * accum
        if micro == micro_total:  # resumed with fewer, larger steps per epoch, at the end of one: nothing left to read
            self._resume_loader = None
            return False, totals
        batches = self._epoch_batches()
        self.stepper.model.train()
        self.timer.reset()
        bar = tqdm(
            total=self.steps_per_epoch, initial=state.epoch_step, desc=f"epoch {state.epoch}", disable=not self.ctx.is_main, leave=False
        )
        try:
            for images, labels in self.timer.iterate(batches):
                final = (micro + 1) % accum == 0
                with self.timer.compute(images=labels.shape[0]):
                    targets = labels
                    if self.mixing.enabled:
                        images, targets = self.mixing.apply(images, labels, self.data.train.last_records, state.epoch, self.num_classes)
                    loss = self.stepper.forward_backward(images, labels, targets, final, totals)
                    if final:
                        self.stepper.optimizer_step()
                micro += 1
                if not final:
                    continue
                state.epoch_step += 1
                state.step += 1
                bar.update(1)
                if state.step % self.config.train.log_every == 0 and self.ctx.is_main:
                    self._log_step(loss, bar)
                if self._agree_to_stop():
                    return True, totals
                if self._checkpoint_due():
                    self._save()
                if micro == micro_total:  # batches beyond a multiple of grad_accum are left unread
                    break
        finally:
            bar.close()
        return False, totals

    def _epoch_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This epoch's batches from where the run stands (every loader resumes from its position in the global stream)."""
        loader, resume = self.data.train, self._resume_loader
        self._resume_loader = None
        if resume is not None:
            loader.load_state_dict(resume)
        else:
            loader.set_epoch(self.state.epoch)
        loader.set_resolution(self.resolutions.at(self.state.epoch))  # the schedule's, also over a resumed state's
        return iter(loader)

    def _log_step(self, loss: torch.Tensor, bar: Any) -> None:
        value, lr = float(loss.float().item()), self.stepper.lr
        bar.set_postfix(loss=f"{value:.3f}", lr=f"{lr:.3g}")
        self.log.step(self.state.epoch, self.state.step, value, lr, self.timer.records[-1] if self.timer.records else None)

    def _agree_to_stop(self) -> bool:
        """True on every rank when any rank got SIGTERM/SIGINT or max_steps is reached.

        With several ranks the signal is agreed on (an all_reduce, then ``.item()``: a wait for the
        GPU) only every STOP_CHECK_STEPS optimizer steps, the same steps on every rank.
        """
        signum = stop_requested() or 0
        if self.ctx.distributed:
            if self.state.step % STOP_CHECK_STEPS:
                return self._max_steps_reached()
            flag = torch.tensor([signum], dtype=torch.int64, device=self.ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            signum = int(flag.item())
        if signum:
            self.result.stopped_by = signal.Signals(signum).name
            if self.ctx.is_main:
                logger.warning("%s: stopping all ranks at step %d and writing a checkpoint", self.result.stopped_by, self.state.step)
            return True
        return self._max_steps_reached()

    def _max_steps_reached(self) -> bool:
        return self.config.train.max_steps is not None and self.state.step >= self.config.train.max_steps

    def _checkpoint_due(self) -> bool:
        every = self.config.output.checkpoint_every_steps
        return bool(every) and self.state.step % every == 0 and self.state.epoch_step < self.steps_per_epoch

    def _end_of_epoch(self, totals: torch.Tensor) -> None:
        if self.ctx.distributed:
            dist.all_reduce(totals)
        loss_sum, top1, topk, samples = totals.tolist()
        summaries = gather_summaries(self.timer.summary(self.ctx.rank))
        k = self.stepper.topk
        record: dict[str, Any] = {
            "kind": "epoch",
            "epoch": self.state.epoch,
            "step": self.state.step,
            "train_loss": loss_sum / max(samples, 1),
            "train_top1": top1 / max(samples, 1),
            f"train_top{k}": topk / max(samples, 1),
            "train_samples": int(samples),
            "images_per_s": global_images_per_s(summaries),
            "imbalance": imbalance(summaries),
            "lr": self.stepper.lr,
            "amp": self.config.train.amp,
            "channels_last": self.config.train.channels_last,
            "resolution": self.data.train.resolution,
            "ranks": [s.to_dict() for s in summaries],
        }
        if self.data.val is not None:
            record["val_resolution"] = val_image_size(self.config)
            record.update(self._validate(self.stepper.model, "val"))
            if self.stepper.ema is not None:
                record.update(self._validate(self.stepper.ema.module, "ema_val"))
        record["wall_s"] = self._wall_s()  # after validation: the time a user waits for this top-1
        self._check_target(record)
        self.result.train_loss.append(record["train_loss"])
        self.result.train_top1.append(record["train_top1"])
        self.result.images_per_s, self.result.imbalance = record["images_per_s"], record["imbalance"]
        target = target_line(self.result.target, self.config.train.target_top1) if self.result.target is not None else None
        self.log.epoch(record, summaries, k, describe(self.config), target)

    def _validate(self, module: torch.nn.Module, prefix: str) -> dict[str, Any]:
        stepper = self.stepper
        metrics = validate(
            module,
            prefix,
            data=self.data,
            config=self.config,
            ctx=self.ctx,
            epoch=self.state.epoch,
            autocast_dtype=stepper.autocast_dtype,
            criterion=stepper.criterion,
            topk=stepper.topk,
        )
        if prefix == "val":
            self.result.val_top1, self.result.val_samples = metrics["val_top1"], metrics["val_samples"]
            self.result.val_topk = metrics[f"val_top{stepper.topk}"]
        else:
            self.result.ema_val_top1 = metrics[f"{prefix}_top1"]
        return metrics

    def _check_target(self, record: dict[str, Any]) -> None:
        """Note the first epoch whose validated top-1 (of the weights or their EMA) reaches train.target_top1."""
        target = self.config.train.target_top1
        if target is None or self.result.target is not None:
            return
        for weights, key in (("live", "val_top1"), ("ema", "ema_val_top1")):
            if record.get(key) is not None and record[key] >= target:
                self.result.target = {"epoch": self.state.epoch, "wall_s": record["wall_s"], "top1": record[key], "weights": weights}
                record["target_reached"] = self.result.target
                return

    def _save(self, stopping: bool = False) -> None:
        path = self.checkpoint.save(self.state, self._wall_s(), stopping)
        self._saved_step = self.state.step
        if path is not None:
            self.result.checkpoint = str(path)


def _seed_everything(seed: int, rank: int) -> None:
    """Same model init on every rank (torch seed), distinct python/numpy streams per rank."""
    random.seed(seed * 1000 + rank)
    np.random.seed([seed, rank])  # any train.seed (seed * 1000 + rank passed 2**32, numpy's limit, from seed 4294968 on)
    torch.manual_seed(seed)
