"""Process helpers, one copy each: the start method, dying with the parent, ending what a dead child leaves, a pool
with a progress bar.

Fork where the platform has it (workers inherit the parent's imports and open nothing twice),
spawn elsewhere. Every process imgpipe starts calls ``die_with_parent``, so a killed run leaves
no orphan writing files or holding memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import BaseContext
from typing import Callable, Iterable, Iterator, TypeVar

PARENT_CHECK_S = 0.2  # how often a child looks whether its parent is still there
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # prctl(2), Linux 3.4 on

T = TypeVar("T")
R = TypeVar("R")


def pool_context() -> BaseContext:
    """The multiprocessing context worker pools use: fork if available, else spawn."""
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def die_with_parent(parent_pid: int, whole_group: bool = False, last: Callable[[], object] | None = None) -> None:
    """SIGKILL this process (``whole_group``: its process group, which it leads) within ``PARENT_CHECK_S``
    of its parent process ``parent_pid`` ending, and only then, calling ``last()`` first (what the parent
    would have cleaned up); exit now if that parent is already gone.

    A daemon thread watches ``getppid()``, which changes only when the whole parent process is
    gone (the child is then re-parented to init or a subreaper). Linux's ``PR_SET_PDEATHSIG``
    is not used: it fires when the parent *thread* that forked the child exits, so workers
    forked from a short-lived thread (a prefetching wrapper) would die with it.
    """
    if whole_group and os.getpgrp() != os.getpid():
        raise ValueError("whole_group: this process does not lead its process group")
    if os.getppid() != parent_pid:
        os._exit(1)
    watch = threading.Thread(target=_watch_parent, args=(parent_pid, whole_group, last), name="imgpipe-parent-watch", daemon=True)
    watch.start()


def _watch_parent(parent_pid: int, whole_group: bool, last: Callable[[], object] | None) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    if last is not None:
        with contextlib.suppress(Exception):
            last()
    if whole_group:
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def end_descendants(grace_s: float = 5.0) -> None:
    """End every process this one started, and theirs: SIGTERM (SIGKILL to a stopped one, which SIGTERM
    cannot end), then SIGKILL to those still there after ``grace_s``."""
    import psutil  # here: the processes that only watch their parent (the store helper) never import it

    try:
        found = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for process in found:
        with contextlib.suppress(psutil.Error):
            process.kill() if process.status() == psutil.STATUS_STOPPED else process.terminate()
    _, alive = psutil.wait_procs(found, timeout=grace_s)
    _kill(alive)
    psutil.wait_procs(alive, timeout=grace_s)


def kill_descendants() -> None:
    """SIGKILL every process this one started, and theirs, at once (all of them found first: none is re-parented
    away before its turn)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        _kill(psutil.Process().children(recursive=True))


def _kill(processes: list) -> None:
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()


@contextlib.contextmanager
def ending_orphans(name: str, value: str) -> Iterator[None]:
    """Within the block, a process whose parent dies is re-parented to this one, not to init (Linux's child subreaper),
    so that what a dead child leaves behind (a worker stuck in a read, stopped, which nothing else would end) stays in
    reach; on leaving, every child of this process whose environment holds ``name=value`` (those the block started, and
    what they left behind) is SIGKILLed with its descendants, and reaped."""
    import psutil

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    was = ctypes.c_int(0)
    adopting = prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) == 0 and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        left = []
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if child.environ().get(name) == value:
                    left += [child, *child.children(recursive=True)]
        _kill(left)
        psutil.wait_procs(left, timeout=5.0)  # the children reaped: no zombie
        if adopting:
            prctl(PR_SET_CHILD_SUBREAPER, was.value, 0, 0, 0)


def exit_now(code: int) -> None:
    """End this process now with ``code``, its standard streams flushed (one closed or broken is passed over): none of
    the interpreter's teardown, where threads of torch or gloo can abort a process that did its work, or a signal kill
    it without a word."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def process_start_time() -> float | None:
    """When this process started (seconds since the epoch, as psutil reads it from the OS); None where it cannot say."""
    import psutil  # here: the processes that only watch their parent (the store helper) never import it

    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return None


def map_in_processes(
    fn: Callable[[T], R],
    tasks: Iterable[T],
    *,
    workers: int,
    chunksize: int = 1,
    desc: str | None = None,
    unit: str = "it",
    progress: bool = False,
) -> Iterator[R]:
    """Yield ``fn(task)`` for each task, in task order: inline for ``workers <= 1``, else in a pool.

    With ``desc``, a tqdm bar (shown when ``progress``) advances once per result.
    """
    from tqdm import tqdm  # here, not above: the processes that only watch their parent (the store helper) never import it

    tasks = list(tasks)
    bar = tqdm(total=len(tasks), unit=unit, desc=desc, disable=not progress or desc is None, dynamic_ncols=True)
    try:
        if workers <= 1:
            for task in tasks:
                yield fn(task)
                bar.update(1)
            return
        with ProcessPoolExecutor(workers, mp_context=pool_context(), initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
            for result in pool.map(fn, tasks, chunksize=chunksize):
                yield result
                bar.update(1)
    finally:
        bar.close()
