"""The process helpers: the pool keeps task order inline and in processes, and workers die with their parent."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

from imgpipe._sys.procs import map_in_processes, pool_context


def _square(x: int) -> int:
    return x * x


def test_results_come_back_in_task_order_inline_and_in_a_pool() -> None:
    tasks = list(range(23))
    expected = [x * x for x in tasks]
    assert list(map_in_processes(_square, tasks, workers=1)) == expected
    assert list(map_in_processes(_square, tasks, workers=2, chunksize=3, desc="t", progress=False)) == expected
    assert list(map_in_processes(_square, [], workers=2)) == []


def test_fork_where_available() -> None:
    expected = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    assert pool_context().get_start_method() == expected


CHILD = """
import os, sys, time
from imgpipe._sys.procs import die_with_parent
parent = os.getpid()
pid = os.fork()
if pid == 0:
    die_with_parent(parent)  # this worker must die with the process that forked it
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


def test_a_worker_dies_when_its_parent_is_killed() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    time.sleep(0.5)  # let it set PR_SET_PDEATHSIG
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(grandchild, signal.SIGKILL)
    raise AssertionError("the worker outlived its killed parent")


def test_exits_at_once_when_the_parent_is_already_gone() -> None:
    code = "from imgpipe._sys.procs import die_with_parent; die_with_parent(1); print('alive')"
    # the parent of this interpreter is not pid 1, so it must exit with status 1 and print nothing
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
