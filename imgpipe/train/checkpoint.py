"""Training checkpoints: written atomically by rank 0, read back with ``torch.load(weights_only=True)``.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts (nothing that needs
pickle's code execution): model, optimizer, scheduler and scaler state, the epoch and step, the
loader's position, the config it ran with, and every rank's RNG states (python, numpy, torch,
CUDA) converted to tensors and lists.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from imgpipe._sys.atomic import atomic_write
from imgpipe.errors import ConfigError

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


def checkpoint_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / CHECKPOINT_NAME


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` so that readers see the previous checkpoint or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **state}, f))


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; a ConfigError says what is wrong with it."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no checkpoint to resume from; start without --resume") from None
    except Exception as e:  # unpickling errors come in many types
        raise ConfigError(f"{path}: not a readable imgpipe checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"{path}: not an imgpipe checkpoint of format {FORMAT_VERSION}")
    return state


def rng_state() -> dict[str, Any]:
    """This process's RNG states as weights_only-safe values."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
