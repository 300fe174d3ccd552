"""One rank's training run: model, DDP, optimizer, the epoch loop, validation, metrics, checkpoints.

Every rank runs :func:`train_rank`; decisions that must agree across ranks (stop on a signal,
checkpoint) are taken by every rank at the same optimizer step, and only rank 0 prints, logs
and writes files.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from imgpipe.errors import ConfigError, DistributedError, ImgpipeError, TrainError
from imgpipe.train import checkpoint as ckpt
from imgpipe.train import faults
from imgpipe.train.blurpool import apply_blurpool
from imgpipe.train.compiling import compile_forward
from imgpipe.train.config import TrainConfig, save_config
from imgpipe.train.data import TrainData, build_data
from imgpipe.train.ema import EmaWeights
from imgpipe.train.launch import RankContext, is_peer_failure, stop_requested
from imgpipe.train.metrics import (
    JsonlWriter,
    StepTimer,
    format_rank_table,
    gather_objects,
    gather_summaries,
    global_images_per_s,
    imbalance,
)
from imgpipe.train.mixing import Mixing
from imgpipe.train.models import check_model_name, create_model, trained_min_size
from imgpipe.train.precision import describe, resolve_auto
from imgpipe.train.process_state import run_scope
from imgpipe.train.resolution import parse_resolution
from imgpipe.train.resume import batch_request, changed_settings, checkpoint_to_resume, resolve_batch, resume_line, resume_position
from imgpipe.train.rundir import METRICS_NAME, TENSORBOARD_DIR

logger = logging.getLogger(__name__)

LINEAR_RAMP_START = 1e-4  # FFCV's get_cyclic_lr: the ramp starts at 1e-4 of the peak
STOP_CHECK_STEPS = 8  # optimizer steps between the ranks' agreements on a stop signal
NONDETERMINISTIC_TEXT = "does not have a deterministic implementation"
UNUSED_PARAMS_TEXT = "Expected to have finished reduction in the prior iteration"


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


@dataclass
class _State:
    epoch: int = 0  # the epoch being run
    epoch_step: int = 0  # optimizer steps done in it
    step: int = 0  # optimizer steps done in the whole run


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
            f"model.num_classes {num_classes} is less than the {len(data.classes)} classes of {config.data.path} (labels 0-{len(data.classes) - 1}); "
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
            run.close()


def explain_failure(error: BaseException, ctx: RankContext, config: TrainConfig) -> ImgpipeError | None:
    """imgpipe's own one-line message for CUDA OOM, CUDA's illegal memory access, an op without a deterministic
    kernel under train.deterministic, DDP's unused parameters, and a peer that died or hung.

    The last is what the healthy ranks see under torchrun or SLURM, where no imgpipe launcher
    watches the ranks (with --gpus/--nproc, the launcher names the failed or hung rank itself).
    """
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return TrainError(_oom_message(ctx, config))
    text = str(error)
    if "illegal memory access" in text:
        return TrainError(
            f"rank {ctx.rank}: CUDA error 'illegal memory access' in model {config.model.name}: a sticky error (this process "
            "cannot use the GPU again), usually a kernel reading out of bounds, such as a label >= the model's classes or "
            "a bug in a custom op, not an out-of-memory; check that labels are below model.num_classes and rerun with "
            "CUDA_LAUNCH_BLOCKING=1 to see the failing op"
        )
    if NONDETERMINISTIC_TEXT in text:
        op = (text.split(NONDETERMINISTIC_TEXT)[0].split() or ["unnamed"])[-1]
        return TrainError(
            f"rank {ctx.rank}: train.deterministic: true, but model {config.model.name} runs an op without a deterministic "
            f"kernel on {ctx.device.type} ({op}); set train.deterministic: false, or choose another model"
        )
    if UNUSED_PARAMS_TEXT in text:
        return TrainError(
            f"DDP found parameters of model {config.model.name!r} that got no gradient in a step: set "
            "train.find_unused_parameters: true (slower), or make every output of the model take part in the loss"
        )
    if ctx.distributed and is_peer_failure(text):
        return DistributedError(
            f"rank {ctx.rank}: {type(error).__name__}: {text.splitlines()[0]}; another rank died, or hung for the process-group "
            f"timeout ({ctx.timeout_s:g} s, train.timeout_s): the other ranks' output names the cause"
        )
    return None


class _Run:
    """The objects of one run and the steps of the loop."""

    def __init__(
        self,
        ctx: RankContext,
        config: TrainConfig,
        data: TrainData,
        num_classes: int,
        saved: dict[str, Any] | None,
        request: dict[str, Any],
    ) -> None:
        self.ctx, self.config, self.data = ctx, config, data
        self._saved = saved  # the checkpoint to resume from
        self._batch_request = request  # the batch the config asked for, kept in checkpoints (see resume.resolve_batch)
        self.device = ctx.device
        self.out = Path(config.output.dir)
        self.accum = config.train.grad_accum
        self.steps_per_epoch = len(data.train) // self.accum
        if self.steps_per_epoch == 0:
            raise ConfigError(f"train.grad_accum {self.accum} is more than the {len(data.train)} batches per epoch of each rank")
        self.global_batch = config.train.batch_size * ctx.world_size * self.accum
        self.num_classes = num_classes
        self.resolutions = parse_resolution(config.data.resolution, config.data.image_size)
        self.mixing = Mixing(config.train.mixup_alpha, config.train.cutmix_alpha, config.train.seed)
        if self.mixing.enabled and config.train.batch_size % 2:
            raise ConfigError(
                f"train.mixup_alpha/train.cutmix_alpha mix each sample with its neighbour in the global batch, so the per-rank "
                f"batch must be even, not {config.train.batch_size}; change train.batch_size or train.global_batch_size"
            )
        self.model, self.ddp = build_model(config, num_classes, ctx)
        self.ema = EmaWeights(self.model, config.train.ema_decay) if config.train.ema else None
        self.forward = compile_forward(self.ddp) if config.train.compile else self.ddp
        self.optimizer = build_optimizer(self.model, config, self.global_batch)
        self.lr_factor = lr_schedule(config, self.steps_per_epoch)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        self.autocast_dtype, self.scaler = precision(config, self.device)
        if (
            config.train.amp == "fp16"
        ):  # the scaler skips steps with inf gradients; the schedule still advances (filter scoped by run_scope)
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=config.optim.label_smoothing)
        self.topk = min(5, num_classes)
        self.state = _State()
        self.timer = StepTimer(self.device)
        self.jsonl = JsonlWriter(self.out / METRICS_NAME, enabled=ctx.is_main)
        self.tb = _tensorboard(self.out / TENSORBOARD_DIR) if ctx.is_main and config.output.tensorboard else None
        self.result = TrainResult(output_dir=str(self.out), epochs_completed=0, step=0, topk=self.topk)
        self._resume_loader: dict[str, Any] | None = None
        self._saved_step = -1
        self._started = time.perf_counter()  # wall_s counts from here, plus what the resumed checkpoint had run
        self._wall_before = 0.0
        if ctx.is_main:
            save_config(config, self.out)
            logger.info(
                "training %s on %d rank(s) (%s, %s%s): %d steps/epoch, global batch %d, lr %.4g, train at %s px, validate at %d px",
                config.model.name,
                ctx.world_size,
                self.device,
                describe(config),
                ", compiled" if config.train.compile else "",
                self.steps_per_epoch,
                self.global_batch,
                config.optim.base_lr * self.global_batch / 256,
                "-".join(map(str, self.resolutions.distinct(config.train.epochs))),
                val_image_size(config),
            )

    # ------------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        self._maybe_resume()
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
        state = self.state
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        micro_total = self.steps_per_epoch * self.accum
        micro = state.epoch_step * self.accum
        if micro == micro_total:  # resumed with fewer, larger steps per epoch, at the end of one: nothing left to read
            self._resume_loader = None
            return False, totals
        batches = self._epoch_batches()
        self.model.train()
        self.timer.reset()
        bar = tqdm(
            total=self.steps_per_epoch, initial=state.epoch_step, desc=f"epoch {state.epoch}", disable=not self.ctx.is_main, leave=False
        )
        try:
            for images, labels in self.timer.iterate(batches):
                final = (micro + 1) % self.accum == 0
                with self.timer.compute(images=labels.shape[0]):
                    targets = labels
                    if self.mixing.enabled:
                        images, targets = self.mixing.apply(images, labels, self.data.train.last_records, state.epoch, self.num_classes)
                    loss = self._forward_backward(images, labels, targets, final, totals)
                    if final:
                        self._optimizer_step()
                micro += 1
                if not final:
                    continue
                state.epoch_step += 1
                state.step += 1
                bar.update(1)
                if state.step % self.config.train.log_every == 0:
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

    def _forward_backward(
        self, images: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor, final: bool, totals: torch.Tensor
    ) -> torch.Tensor:
        """One micro-batch; ``targets`` are the labels, or the soft targets of mixup/cutmix (accuracy counts ``labels``)."""
        sync = contextlib.nullcontext() if final or not self.ctx.distributed else self.ddp.no_sync()
        with sync:
            with autocast(self.device, self.autocast_dtype):
                output = self.forward(images)
                loss = self.criterion(output, targets)
            self.scaler.scale(loss / self.accum).backward()
        with torch.no_grad():
            _accumulate(totals, loss.detach(), output.detach(), labels, self.topk)
        return loss.detach()

    def _optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model)

    def _agree_to_stop(self) -> bool:
        """True on every rank when any rank got SIGTERM/SIGINT or max_steps is reached.

        With several ranks the signal is agreed on (an all_reduce, then ``.item()``: a wait for the
        GPU) only every STOP_CHECK_STEPS optimizer steps, the same steps on every rank.
        """
        signum = stop_requested() or 0
        if self.ctx.distributed:
            if self.state.step % STOP_CHECK_STEPS:
                return self._max_steps_reached()
            flag = torch.tensor([signum], dtype=torch.int64, device=self.device)
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

    # ------------------------------------------------------------------ epoch end

    def _end_of_epoch(self, totals: torch.Tensor) -> None:
        if self.ctx.distributed:
            dist.all_reduce(totals)
        loss_sum, top1, topk, samples = totals.tolist()
        summaries = gather_summaries(self.timer.summary(self.ctx.rank))
        record: dict[str, Any] = {
            "kind": "epoch",
            "epoch": self.state.epoch,
            "step": self.state.step,
            "train_loss": loss_sum / max(samples, 1),
            "train_top1": top1 / max(samples, 1),
            f"train_top{self.topk}": topk / max(samples, 1),
            "train_samples": int(samples),
            "images_per_s": global_images_per_s(summaries),
            "imbalance": imbalance(summaries),
            "lr": self.optimizer.param_groups[0]["lr"],
            "amp": self.config.train.amp,
            "channels_last": self.config.train.channels_last,
            "resolution": self.data.train.resolution,
            "ranks": [s.to_dict() for s in summaries],
        }
        if self.data.val is not None:
            record["val_resolution"] = val_image_size(self.config)
            record.update(self._validate(self.model, "val"))
            if self.ema is not None:
                record.update(self._validate(self.ema.module, "ema_val"))
        record["wall_s"] = self._wall_s()  # after validation: the time a user waits for this top-1
        self._check_target(record)
        self.result.train_loss.append(record["train_loss"])
        self.result.train_top1.append(record["train_top1"])
        self.result.images_per_s, self.result.imbalance = record["images_per_s"], record["imbalance"]
        if self.ctx.is_main:
            lines = [
                f"epoch {self.state.epoch}: step {self.state.step}, {record['wall_s']:.1f} s, {record['resolution']} px, train loss {record['train_loss']:.4f}, "
                f"top-1 {record['train_top1']:.4f}, top-{self.topk} {record[f'train_top{self.topk}']:.4f} ({int(samples)} samples, all ranks; "
                f"{describe(self.config)})",
                format_rank_table(summaries),
            ]
            for prefix, name in (("val", "val"), ("ema_val", "ema val")):
                if f"{prefix}_top1" in record:
                    lines.append(
                        f"{name}: {record[f'{prefix}_samples']} samples at {record['val_resolution']} px, loss {record[f'{prefix}_loss']:.4f}, "
                        f"top-1 {record[f'{prefix}_top1']:.4f}, top-{self.topk} {record[f'{prefix}_top{self.topk}']:.4f}"
                    )
            if self.result.target is not None:
                lines.append(target_line(self.result.target, self.config.train.target_top1))
            tqdm.write("\n".join(lines))
            self.jsonl.write(record)
            if self.tb is not None:
                for key, value in record.items():
                    if isinstance(value, float):
                        self.tb.add_scalar(f"epoch/{key}", value, self.state.step)
                self.tb.flush()

    def _validate(self, module: torch.nn.Module, prefix: str) -> dict[str, Any]:
        """Exact validation of ``module``: every val record once across ranks; counts are all-reduced.
        With data.val_flip_tta, the logits are the mean of each image's and its mirror's."""
        _broadcast_buffers(module, self.ctx)
        training = module.training
        module.eval()
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        self.data.val.set_epoch(self.state.epoch)
        with torch.no_grad():
            for images, labels in faults.val_batches(self.data.val, self.ctx.rank):
                with autocast(self.device, self.autocast_dtype):
                    output = val_logits(module, images, self.config.data.val_flip_tta)
                    loss = self.criterion(output.float(), labels)
                _accumulate(totals, loss, output, labels, self.topk)
        if self.ctx.distributed:
            dist.all_reduce(totals)
        module.train(training)
        loss_sum, top1, topk, samples = totals.tolist()
        samples = int(samples)
        if samples != self.data.val_records:  # every rank has the all-reduced count: all stop together
            raise TrainError(
                f"validation saw {samples} samples but split {self.config.data.val_split!r} of {self.config.data.path} has "
                f"{self.data.val_records} records, so its accuracy is not that of the split; run 'imgpipe verify {self.config.data.path}' "
                "and report it as an imgpipe bug if the data is intact"
            )
        if prefix == "val":
            self.result.val_top1, self.result.val_topk, self.result.val_samples = top1 / max(samples, 1), topk / max(samples, 1), samples
        else:
            self.result.ema_val_top1 = top1 / max(samples, 1)
        return {
            f"{prefix}_samples": samples,
            f"{prefix}_loss": loss_sum / max(samples, 1),
            f"{prefix}_top1": top1 / max(samples, 1),
            f"{prefix}_top{self.topk}": topk / max(samples, 1),
        }

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

    def _log_step(self, loss: torch.Tensor, bar: Any) -> None:
        if not self.ctx.is_main:
            return
        last = self.timer.records[-1] if self.timer.records else None
        value = float(loss.float().item())
        lr = self.optimizer.param_groups[0]["lr"]
        bar.set_postfix(loss=f"{value:.3f}", lr=f"{lr:.3g}")
        self.jsonl.write(
            {
                "kind": "step",
                "epoch": self.state.epoch,
                "step": self.state.step,
                "loss": value,
                "lr": lr,
                "data_s": last.data_s if last else None,
                "compute_s": last.compute_s if last else None,
            }
        )
        if self.tb is not None:
            self.tb.add_scalar("step/loss_rank0", value, self.state.step)
            self.tb.add_scalar("step/lr", lr, self.state.step)

    # ------------------------------------------------------------------ checkpoints

    def _save(self, stopping: bool = False) -> None:
        """Every rank calls this at the same step (RNG states are gathered); rank 0 writes."""
        rngs = gather_objects(ckpt.rng_state(self.device))
        self._saved_step = self.state.step
        if not self.ctx.is_main:
            return
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.state.epoch,
            "epoch_step": self.state.epoch_step,
            "step": self.state.step,
            "loader": self.data.train.state_dict() if self.state.epoch_step else None,
            "rng": rngs,
            "world_size": self.ctx.world_size,
            "global_batch": self.config.train.batch_size * self.ctx.world_size,  # G: the loader stream's step
            "batch_request": self._batch_request,
            "num_classes": self.num_classes,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "wall_s": self._wall_s(),
            "config": self.config.to_dict(),
        }
        path = ckpt.save_checkpoint(ckpt.checkpoint_path(self.out), state)
        self.result.checkpoint = str(path)
        logger.info(
            "checkpoint: %s (epoch %d, step %d)%s", path, self.state.epoch, self.state.step, "; resume with --resume" if stopping else ""
        )

    def _maybe_resume(self) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        path = ckpt.checkpoint_path(self.out)
        ckpt.load_model_state(self.model, saved, path, self.config.model.name, self.num_classes)
        position = resume_position(
            saved,
            self.config,
            global_batch=self.config.train.batch_size * self.ctx.world_size,
            steps_per_epoch=self.steps_per_epoch,
            records=self.data.train_records,
            path=path,
        )
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        if self.ema is not None:
            self.ema.load_state_dict(saved["ema"] if saved.get("ema") is not None else self.model.state_dict())
        self._wall_before = float(saved.get("wall_s", 0.0))
        self.state = _State(epoch=position.epoch, epoch_step=position.epoch_step, step=position.step)
        self._resume_loader = position.loader
        apply_optim_config(self.optimizer, self.scheduler, self.config, self.global_batch, self.lr_factor, position.step)
        rngs = saved["rng"]
        ckpt.set_rng_state(rngs[self.ctx.rank] if self.ctx.rank < len(rngs) else rngs[0], self.device)
        logger.info("resumed from %s at epoch %d, step %d", path, self.state.epoch, self.state.step)
        logger.info(
            "%s", resume_line(saved, self.ctx.world_size, self.config.train.batch_size, position, changed_settings(saved, self.config))
        )

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


# ----------------------------------------------------------------------------- building blocks


def build_model(config: TrainConfig, num_classes: int, ctx: RankContext) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(model, what to call it through): the model (with BlurPool when model.blurpool) on this rank's device, DDP-wrapped when distributed.

    The name is checked by :func:`check_model_name` before the data is built (see :func:`train_rank`).
    """
    model = create_model(config.model.name, num_classes)
    if config.model.blurpool:
        apply_blurpool(model)
    faults.install(model, ctx.rank)
    if config.train.sync_bn and ctx.distributed:
        if ctx.device.type != "cuda":
            raise ConfigError("train.sync_bn needs GPUs (SyncBatchNorm is CUDA-only); set it to false for CPU runs")
        logger.warning(
            "train.sync_bn: every BatchNorm layer now all-reduces its statistics in every step; expect a slower step (worth it only for small per-rank batches)"
        )
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    memory_format = torch.channels_last if config.train.channels_last else torch.contiguous_format
    model = model.to(ctx.device, memory_format=memory_format)
    check_image_size(model, config, ctx.device)
    check_deterministic(model, config, ctx.device)
    if not ctx.distributed:
        return model, model
    ddp = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        find_unused_parameters=config.train.find_unused_parameters,
    )
    return model, ddp


def precision(config: TrainConfig, device: torch.device) -> tuple[torch.dtype | None, torch.amp.GradScaler]:
    """train.amp as (the autocast dtype, None for fp32; the gradient scaler, enabled for fp16 only)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.train.amp)
    return dtype, torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)


def autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """The forward pass's autocast context: ``dtype`` on ``device``, off for None."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def check_image_size(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> None:
    """A ConfigError unless ``model`` takes every size the run feeds it (the training sizes of data.resolution,
    else data.image_size, and the validation size): one forward pass of one blank image each, in eval mode.

    Some models only take one size (ViT: 224 px) and fail deep inside their forward otherwise.
    """
    sizes = parse_resolution(config.data.resolution, config.data.image_size).distinct(config.train.epochs)
    key = "data.resolution" if config.data.resolution is not None else "data.image_size"
    checks = [(size, key) for size in sizes]
    if config.train.validate:
        checks.append((val_image_size(config), "data.val_image_size" if config.data.val_image_size else "data.image_size"))
    model.eval()
    try:
        for size, key in dict(checks).items():
            try:
                with torch.no_grad():
                    model(torch.zeros(1, 3, size, size, device=device))
            except (AssertionError, RuntimeError, ValueError) as e:
                trained = trained_min_size(config.model.name)
                hint = f"; its weights were made at {trained} px or more" if trained and trained > size else ""
                raise ConfigError(
                    f"model {config.model.name} cannot take {key} {size} images ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                    f"{hint}; set {key} to sizes the model takes"
                ) from None
    finally:
        model.train()


def val_logits(module: torch.nn.Module, images: torch.Tensor, flip_tta: bool) -> torch.Tensor:
    """The validation logits: ``module``'s, or with ``flip_tta`` the mean of the image's and its mirror's (FFCV's lr_tta)."""
    output = module(images)
    return (output + module(images.flip(3))) / 2 if flip_tta else output


def val_image_size(config: TrainConfig) -> int:
    """The validation size: data.val_image_size, else data.image_size."""
    return config.data.val_image_size or config.data.image_size


def target_line(target: dict[str, Any], wanted: float | None) -> str:
    """The line that says when train.target_top1 was reached."""
    weights = "the EMA weights" if target["weights"] == "ema" else "the weights"
    return (
        f"target top-1 {wanted:.4f} reached at epoch {target['epoch']} after {target['wall_s']:.1f} s "
        f"({weights}: {target['top1']:.4f}); stopping"
    )


def check_deterministic(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> None:
    """A ConfigError when train.deterministic asks CUDA for a backward pass it has no deterministic kernel for.

    Adaptive pooling to anything but 1x1 (VGG, AlexNet: 7x7; Inception's auxiliary heads) has
    none on CUDA (pooling to 1x1 is a mean, which has); torch would fail in the first backward.
    """
    if not config.train.deterministic or device.type != "cuda":
        return
    pools = (
        torch.nn.AdaptiveAvgPool1d,
        torch.nn.AdaptiveAvgPool2d,
        torch.nn.AdaptiveAvgPool3d,
        torch.nn.AdaptiveMaxPool1d,
        torch.nn.AdaptiveMaxPool2d,
        torch.nn.AdaptiveMaxPool3d,
    )
    for name, module in model.named_modules():
        if isinstance(module, pools):
            size = module.output_size if isinstance(module.output_size, tuple) else (module.output_size,)
            if isinstance(module, pools[3:]) or any(s != 1 for s in size):
                raise ConfigError(
                    f"train.deterministic: true on CUDA, but model {config.model.name} has {type(module).__name__}"
                    f"(output_size={module.output_size}) at {name!r}, whose backward pass CUDA can only run non-deterministically; "
                    "set train.deterministic: false, or choose a model that pools to 1x1 (resnet, efficientnet, ...)"
                )


def build_optimizer(model: torch.nn.Module, config: TrainConfig, global_batch: int) -> torch.optim.Optimizer:
    """SGD with lr = base_lr * global_batch / 256; BN and bias parameters (ndim <= 1) decay by optim.bn_weight_decay
    (0 by default, as FFCV's and timm's), the others by optim.weight_decay."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.optim.weight_decay},
        {"params": no_decay, "weight_decay": config.optim.bn_weight_decay},
    ]
    return torch.optim.SGD(
        groups,
        lr=config.optim.base_lr * global_batch / 256,
        momentum=config.optim.momentum,
        nesterov=config.optim.nesterov and config.optim.momentum > 0,
    )


def apply_optim_config(
    optimizer: torch.optim.Optimizer, scheduler: Any, config: TrainConfig, global_batch: int, lr_factor: Any, step: int
) -> None:
    """After loading a checkpoint's optimizer and scheduler: the config's hyper-parameters, at ``step`` of its schedule.

    Loading restores the saved lr, momentum and weight decay (and the scheduler its base lr), which
    would silently ignore a changed ``optim`` section or global batch; the momentum buffers stay.
    """
    lr = config.optim.base_lr * global_batch / 256
    decay, no_decay = optimizer.param_groups  # as build_optimizer makes them
    for group, weight_decay in ((decay, config.optim.weight_decay), (no_decay, config.optim.bn_weight_decay)):
        group.update(
            initial_lr=lr,
            lr=lr * lr_factor(step),
            weight_decay=weight_decay,
            momentum=config.optim.momentum,
            nesterov=config.optim.nesterov and config.optim.momentum > 0,
        )
    scheduler.load_state_dict({**scheduler.state_dict(), "base_lrs": [lr, lr], "last_epoch": step})


def lr_schedule(config: TrainConfig, steps_per_epoch: int) -> Any:
    """Multiplier of the scaled lr at optimizer step s: linear warmup, then cosine to 0 or step decay; or
    linear_ramp, FFCV's cyclic schedule: from 1e-4 at step 0 linearly up to 1 at optim.lr_peak_epoch,
    then linearly down to 0 at the end of train.epochs (FFCV interpolates per epoch, then per step
    inside each epoch: the same line, its knots on whole epochs)."""
    warmup = int(round(config.optim.warmup * steps_per_epoch))
    total = max(1, config.train.epochs * steps_per_epoch)
    boundaries = [e * steps_per_epoch for e in config.optim.step_epochs]
    gamma, cosine = config.optim.step_gamma, config.optim.schedule == "cosine"
    peak = config.optim.lr_peak_epoch * steps_per_epoch

    def factor(step: int) -> float:
        if config.optim.schedule == "linear_ramp":
            return float(np.interp(step, [0, peak, total], [LINEAR_RAMP_START, 1.0, 0.0]))
        if step < warmup:
            return (step + 1) / warmup
        if cosine:
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return gamma ** sum(step >= b for b in boundaries)

    return factor


def _accumulate(totals: torch.Tensor, loss: torch.Tensor, output: torch.Tensor, labels: torch.Tensor, k: int) -> None:
    """Add a batch's [loss sum, top-1 hits, top-k hits, samples] to ``totals``, on the device (no host sync)."""
    hits = output.topk(k, dim=1).indices.eq(labels.view(-1, 1))
    n = labels.shape[0]
    totals[:3] += torch.stack([loss.double() * n, hits[:, 0].sum().double(), hits.any(dim=1).sum().double()])
    totals[3] += n


def _broadcast_buffers(module: torch.nn.Module, ctx: RankContext) -> None:
    """Give every rank rank 0's BatchNorm statistics, so validation is the same model everywhere."""
    if ctx.distributed:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


def _seed_everything(seed: int, rank: int) -> None:
    """Same model init on every rank (torch seed), distinct python/numpy streams per rank."""
    random.seed(seed * 1000 + rank)
    np.random.seed([seed, rank])  # any train.seed (seed * 1000 + rank passed 2**32, numpy's limit, from seed 4294968 on)
    torch.manual_seed(seed)


def _tensorboard(folder: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.debug("tensorboard not installed: metrics go to metrics.jsonl only")
        return None
    return SummaryWriter(str(folder))


def _oom_message(ctx: RankContext, config: TrainConfig) -> str:
    memory = ""
    if ctx.device.type == "cuda":
        with contextlib.suppress(Exception):
            free, total = torch.cuda.mem_get_info(ctx.device)
            peak = torch.cuda.max_memory_allocated(ctx.device)
            memory = f"; peak allocated {peak / 2**30:.1f} GiB, free {free / 2**30:.1f} of {total / 2**30:.1f} GiB"
    return (
        f"rank {ctx.rank}: CUDA out of memory with train.batch_size={config.train.batch_size} per process, model {config.model.name}, "
        f"image_size {config.data.image_size}, amp {config.train.amp}{memory}; lower train.batch_size (keep the global batch "
        f"with train.grad_accum), use train.amp: bf16, and check that no other process holds this GPU (nvidia-smi)"
    )
