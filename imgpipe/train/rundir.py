"""A run's output folder: a new run never writes over another run's checkpoint and metrics by accident.

A re-submitted job script without ``--resume`` would otherwise overwrite the run's checkpoint
and append to its ``metrics.jsonl``. So a folder holding a checkpoint is refused unless the
config continues it (``output.resume``) or asks to start afresh (``output.overwrite``), which
first removes that run's checkpoint and TensorBoard events and empties its metrics. Torch-free:
the launcher calls it before it starts any rank.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.oserrors import describe, write_probe
from imgpipe.errors import ConfigError
from imgpipe.train.config import TrainConfig

CHECKPOINT_NAME = "checkpoint.pt"
METRICS_NAME = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def checkpoint_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / CHECKPOINT_NAME


def make_output_dir(config: TrainConfig) -> Path:
    """Create ``output.dir`` now, so that a path that cannot be a folder fails before any data is opened."""
    folder = Path(config.output.dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"output.dir {folder}: is a file, not a folder; choose another output.dir") from None
    except OSError as e:
        raise ConfigError(f"output.dir {folder}: cannot create it ({e.strerror}); choose another output.dir") from None
    refused = write_probe(folder)
    if refused is not None:
        raise ConfigError(f"output.dir {folder}: cannot write there: {describe(refused, writing=True)}; or choose another output.dir")
    return folder


def claim_output_dir(config: TrainConfig, *, is_main: bool) -> Path:
    """Create ``output.dir``; unless the run resumes, refuse one that holds a checkpoint, or (``is_main``) clear it for a fresh start."""
    folder = make_output_dir(config)
    checkpoint = checkpoint_path(folder)
    if config.output.resumes(checkpoint.exists()):
        return folder
    if checkpoint.exists() and not config.output.overwrite:
        raise ConfigError(
            f"output.dir {folder} already holds a run ({CHECKPOINT_NAME}); continue it with --resume (output.resume: true), "
            "start it again with --overwrite (output.overwrite: true; deletes its checkpoint, metrics and TensorBoard events), "
            "or choose another output.dir"
        )
    if is_main:
        start_afresh(folder)
    return folder


def start_afresh(folder: Path) -> None:
    """Remove a previous run's checkpoint and TensorBoard events, and replace its metrics with an empty file (atomically)."""
    checkpoint_path(folder).unlink(missing_ok=True)
    if (folder / TENSORBOARD_DIR).is_dir():
        shutil.rmtree(folder / TENSORBOARD_DIR)
    atomic_write_bytes(folder / METRICS_NAME, b"")
