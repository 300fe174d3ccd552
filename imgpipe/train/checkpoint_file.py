"""The training checkpoint's file: written atomically by rank 0, read back with ``torch.load(weights_only=True)``.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts (nothing that needs
pickle's code execution): model, optimizer, scheduler and scaler state, the epoch and step, the
loader's position in the global stream and the global batch G (so a run resumes on any rank
count that divides G, ``imgpipe.train.resume``), the config it ran with, and every rank's RNG
states (python, numpy, torch, and the CUDA generator of that rank's own GPU) converted to
tensors and lists.
"""

from __future__ import annotations

import logging
import os
import random
import warnings
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from imgpipe._sys.atomic import atomic_write
from imgpipe._sys.oserrors import describe
from imgpipe._sys.regular import open_regular
from imgpipe.errors import ConfigError, TrainError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
COUNTS = {"world_size": 1, "global_batch": 1, "epoch": 0, "epoch_step": 0, "step": 0}  # the least each may be


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` so that readers see the previous checkpoint or the whole new one.

    A write that fails (a full disk, a quota, a read-only file system) is one TrainError naming
    the file and what to do. torch's zip writer swallows the OSError of the file it writes to and
    fails later with its own "unexpected pos" error, so the file is wrapped to keep that OSError.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    failed: list[OSError] = []
    try:
        return atomic_write(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **state}, _KeepWriteError(f, failed)))
    except (OSError, RuntimeError) as e:
        error = failed[0] if failed else e if isinstance(e, OSError) else None
        if error is None:
            raise
        raise TrainError(
            f"{path}: cannot write the checkpoint: {describe(error, writing=True)}, or set output.dir to another file system; "
            "the checkpoint written before, if any, is intact: continue from it with --resume"
        ) from None


class _KeepWriteError:
    """A binary file whose ``write`` remembers the OSError it raises (see save_checkpoint)."""

    def __init__(self, file: BinaryIO, failed: list[OSError]) -> None:
        self.file, self.failed = file, failed

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.failed.append(e)
            raise

    def flush(self) -> None:
        self.file.flush()


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; a ConfigError says what is wrong with it."""
    path = Path(path)
    try:
        file = open_regular(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no checkpoint to resume from; start without --resume") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the checkpoint ({e.strerror}); move it away and train without --resume") from None
    try:
        with file, warnings.catch_warnings():  # a foreign pickle's protocol warning would precede the one-line error
            warnings.simplefilter("ignore")
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types; torch's text may advise weights_only=False: never pass that on
        raise ConfigError(
            f"{path}: not a readable imgpipe checkpoint ({type(e).__name__}: damaged, truncated, or not written by imgpipe train); "
            "restore it from a copy, or move it away and train without --resume"
        ) from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"{path}: not an imgpipe checkpoint of format {FORMAT_VERSION}")
    for name, least in COUNTS.items():  # resuming divides by them and counts steps with them
        if name == "global_batch" and name not in state:  # not stored before resume-anywhere
            continue
        value = state.get(name)
        if type(value) is not int or value < least:
            what = f"{name} is {value!r}, not a count of {least} or more" if name in state else f"lacks its {name}"
            raise ConfigError(
                f"{path}: the checkpoint {what}: it is damaged or not written by imgpipe train; "
                "restore it from a copy, or move it away and train without --resume"
            )
    return state


def load_model_state(model: torch.nn.Module, saved: dict[str, Any], path: str | os.PathLike, name: str, num_classes: int) -> None:
    """Load the checkpoint's weights into ``model``, or one ConfigError naming both models and class counts.

    torch's own refusal lists every mismatched key: hundreds for another architecture.
    """
    saved_name = saved.get("config", {}).get("model", {}).get("name", "?")
    saved_classes = saved.get("num_classes")  # absent from checkpoints written before it was stored
    advice = "resume with the checkpoint's model.name and class count, or train into another output.dir"
    if saved_name != name or saved_classes not in (None, num_classes):
        raise ConfigError(
            f"{path}: the checkpoint is model {saved_name} with {saved_classes if saved_classes else 'unknown'} classes, "
            f"the config asks for {name} with {num_classes}; {advice}"
        )
    try:
        model.load_state_dict(saved["model"])
    except RuntimeError:
        raise ConfigError(f"{path}: the checkpoint's weights do not fit model {name} with {num_classes} classes; {advice}") from None


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """This process's RNG states as weights_only-safe values; on a CUDA ``device``, that GPU's generator only.

    Only this rank's GPU: the states of every visible GPU would not load where fewer are visible.
    """
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore what :func:`rng_state` captured; the CUDA state goes to ``device``, when it is a CUDA device."""
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
