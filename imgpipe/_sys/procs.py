"""Process helpers, one copy each: the start method, dying with the parent, a pool with a progress bar.

Fork where the platform has it (workers inherit the parent's imports and open nothing twice),
spawn elsewhere. Workers ask Linux to SIGKILL them when their parent dies, so a killed run
leaves no orphan writing files.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import BaseContext
from typing import Callable, Iterable, Iterator, TypeVar

from tqdm import tqdm

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

T = TypeVar("T")
R = TypeVar("R")


def pool_context() -> BaseContext:
    """The multiprocessing context worker pools use: fork if available, else spawn."""
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def die_with_parent(parent_pid: int) -> None:
    """Have Linux SIGKILL this process when its parent dies; exit now if ``parent_pid`` is already gone."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
            logger.debug("prctl(PR_SET_PDEATHSIG) unavailable")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def map_in_processes(
    fn: Callable[[T], R], tasks: Iterable[T], *, workers: int, chunksize: int = 1,
    desc: str | None = None, unit: str = "it", progress: bool = False,
) -> Iterator[R]:
    """Yield ``fn(task)`` for each task, in task order: inline for ``workers <= 1``, else in a pool.

    With ``desc``, a tqdm bar (shown when ``progress``) advances once per result.
    """
    tasks = list(tasks)
    bar = tqdm(total=len(tasks), unit=unit, desc=desc, disable=not progress or desc is None, dynamic_ncols=True)
    try:
        if workers <= 1:
            for task in tasks:
                yield fn(task)
                bar.update(1)
            return
        with ProcessPoolExecutor(workers, mp_context=pool_context()) as pool:
            for result in pool.map(fn, tasks, chunksize=chunksize):
                yield result
                bar.update(1)
    finally:
        bar.close()
