"""Process-tree helpers for the training tests: descendants of a pid, through psutil."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil


def children(pid: int) -> list[int]:
    """Direct children of ``pid``, oldest first."""
    try:
        kids = psutil.Process(pid).children()
    except psutil.Error:
        return []
    found = []
    for kid in kids:
        try:
            found.append((kid.create_time(), kid.pid))
        except psutil.Error:
            continue
    return [p for _, p in sorted(found)]


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out.extend(kids)
        todo.extend(kids)
    return out


def cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


RANK_MODULE = "imgpipe.train.rank_main"


def rank_processes(launcher: int) -> list[int]:
    """The rank processes imgpipe's launcher started, oldest first."""
    return [p for p in children(launcher) if RANK_MODULE in cmdline(p)]


def stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def torchrun_logs(tmp_path: Path) -> list[str]:
    """torchrun's option for its log folder, inside the test's own: by default it makes a /tmp/torchelastic_* per run and leaves it."""
    return ["--log-dir", str(tmp_path / "torchrun-logs")]


def quiet_env(**extra: str) -> dict[str, str]:
    """The test's environment without launcher variables, one thread per rank (2 cores)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} and not k.startswith("SLURM_")
    }
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env
