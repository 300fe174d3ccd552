"""What rank 0 reports of a run: ``metrics.jsonl``, TensorBoard's scalars, and the lines printed at each epoch's end.

Step records carry the loss, the lr and the step's data and compute time; epoch records the
all-reduced training and validation metrics and the per-rank table. TensorBoard is optional: when
it is not installed the metrics go to ``metrics.jsonl`` only. Other ranks report nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from imgpipe.train.metrics import JsonlWriter, RankSummary, StepRecord, format_rank_table
from imgpipe.train.rundir import METRICS_NAME, TENSORBOARD_DIR

logger = logging.getLogger(__name__)


class RunLog:
    """rank 0's ``metrics.jsonl`` and TensorBoard writer (``enabled`` False elsewhere: nothing is written)."""

    def __init__(self, out: Path, enabled: bool, tensorboard: bool) -> None:
        self.enabled = enabled
        self.jsonl = JsonlWriter(out / METRICS_NAME, enabled=enabled)
        self.tb = _tensorboard(out / TENSORBOARD_DIR) if enabled and tensorboard else None

    def step(self, epoch: int, step: int, loss: float, lr: float, last: StepRecord | None) -> None:
        """A step record: its loss (rank 0's), lr and the last step's data and compute time."""
        if not self.enabled:
            return
        record = {
            "kind": "step",
            "epoch": epoch,
            "step": step,
            "loss": loss,
            "lr": lr,
            "data_s": last.data_s if last else None,
            "compute_s": last.compute_s if last else None,
        }
        self.jsonl.write(record)
        if self.tb is not None:
            self.tb.add_scalar("step/loss_rank0", loss, step)
            self.tb.add_scalar("step/lr", lr, step)

    def epoch(self, record: dict[str, Any], summaries: Sequence[RankSummary], topk: int, ran: str, target: str | None) -> None:
        """Print the epoch's lines (training, the per-rank table, each validation, the target) and log its record.

        ``ran``: what ran, in words (``precision.describe``); ``target``: the line saying train.target_top1 was reached.
        """
        if not self.enabled:
            return
        lines = [
            f"epoch {record['epoch']}: step {record['step']}, {record['wall_s']:.1f} s, {record['resolution']} px, "
            f"train loss {record['train_loss']:.4f}, "
            f"top-1 {record['train_top1']:.4f}, top-{topk} {record[f'train_top{topk}']:.4f} ({record['train_samples']} samples, all ranks; "
            f"{ran})",
            format_rank_table(summaries),
        ]
        for prefix, name in (("val", "val"), ("ema_val", "ema val")):
            if f"{prefix}_top1" in record:
                lines.append(
                    f"{name}: {record[f'{prefix}_samples']} samples at {record['val_resolution']} px, loss {record[f'{prefix}_loss']:.4f}, "
                    f"top-1 {record[f'{prefix}_top1']:.4f}, top-{topk} {record[f'{prefix}_top{topk}']:.4f}"
                )
        if target is not None:
            lines.append(target)
        tqdm.write("\n".join(lines))
        self.jsonl.write(record)
        if self.tb is not None:
            for key, value in record.items():
                if isinstance(value, float):
                    self.tb.add_scalar(f"epoch/{key}", value, record["step"])
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def target_line(target: dict[str, Any], wanted: float | None) -> str:
    """The line that says when train.target_top1 was reached."""
    weights = "the EMA weights" if target["weights"] == "ema" else "the weights"
    return (
        f"target top-1 {wanted:.4f} reached at epoch {target['epoch']} after {target['wall_s']:.1f} s "
        f"({weights}: {target['top1']:.4f}); stopping"
    )


def _tensorboard(folder: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.debug("tensorboard not installed: metrics go to metrics.jsonl only")
        return None
    return SummaryWriter(str(folder))
