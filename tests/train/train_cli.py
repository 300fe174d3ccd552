"""Helpers for tests that run the real ``imgpipe train`` CLI: a tiny config, the subprocess call, its one-line error."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import yaml
from proctree import quiet_env

VAL_RECORDS = 40  # 4 classes x 10 (the ``packed`` fixture of conftest.py)
SYNTHETIC = ("--set", "data.backend=synthetic", "--set", "train.validate=false")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago: the MASTER_PORT of ranks a test starts without imgpipe's launcher."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def write_config(folder: Path, packed: Path, workers: int = 0, base_lr: float = 0.1, tensorboard: bool = False, **train: object) -> Path:
    """resnet18 at 32 px, batch 16 per rank: 5 optimizer steps per epoch on 2 ranks.

    base_lr 0.1: at 0.4 the third epoch's val top-1 ranged 0.33-0.98 over seeds 0-3 and moved
    with sub-1/255 pixel changes (resampling rounding); at 0.1 it was 0.95-1.0.
    """
    config = {
        "data": {"path": str(packed), "workers": workers, "image_size": 32},
        "model": {"name": "resnet18"},
        "optim": {"base_lr": base_lr, "warmup_epochs": 0.5, "label_smoothing": 0.0},
        "train": {"epochs": 3, "batch_size": 16, "seed": 0, "timeout_s": 60, "log_every": 1, **train},
        "output": {"dir": str(folder / "run"), "tensorboard": tensorboard, "checkpoint_every_epochs": 0},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def imgpipe_train(config: Path, *args: str, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), *args]
    return subprocess.run(cmd, env=env or quiet_env(), capture_output=True, text=True, timeout=timeout)


def epochs_of(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "epoch"]


def one_line_error(done: subprocess.CompletedProcess, *words: str) -> str:
    """The error line of a failed run: one ``imgpipe: error: ...`` line, last on stderr, holding every word; no traceback."""
    assert done.returncode != 0, done.stdout[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("imgpipe: error:")]
    assert len(errors) == 1 and done.stderr.strip().splitlines()[-1] == errors[0], done.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]
