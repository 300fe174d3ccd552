"""The process helpers: the pool keeps task order inline and in processes, and workers die with their parent
process (not with the thread that forked them)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from imgpipe._sys.procs import PARENT_CHECK_S, map_in_processes, pool_context
from tests.train.proctree import alive, wait_gone


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
import os, sys, threading
from imgpipe._sys.procs import die_with_parent
parent = os.getpid()
pid = os.fork()
if pid == 0:
    die_with_parent(parent)  # this worker must die with the process that forked it
    threading.Event().wait(60)  # held until it dies (a minute at most)
    os._exit(0)
print(pid, flush=True)
threading.Event().wait(60)  # held until the test kills it (a minute at most)
"""


def test_a_worker_dies_when_its_parent_is_killed() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    left = wait_gone([grandchild], 10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the worker outlived its killed parent"


CHILD_OF_A_THREAD = """
import os, threading
from imgpipe._sys.procs import die_with_parent
parent = os.getpid()

def fork_a_worker():
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        die_with_parent(parent)
        os.write(tell, b"x")
        threading.Event().wait(60)  # held until it dies (a minute at most)
        os._exit(0)
    os.read(ready, 1)  # the worker is set up while the thread that forked it still runs
    print(pid, flush=True)

thread = threading.Thread(target=fork_a_worker)
thread.start()
thread.join()  # the thread that forked the worker is gone; the process is not
print("thread gone", flush=True)
threading.Event().wait(60)  # held until the test kills it (a minute at most)
"""


@pytest.mark.timeout(60)
def test_a_worker_outlives_the_thread_that_forked_it_and_dies_with_the_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD_OF_A_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(child.stdout.readline())
        assert child.stdout.readline().strip() == "thread gone"
        time.sleep(10 * PARENT_CHECK_S)  # elapsed time is what is tested: ten of the worker's parent checks pass
        assert alive(worker), "the worker died with the thread that forked it"
    finally:
        child.kill()
        child.wait(timeout=10)
    left = wait_gone([worker], 10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the worker outlived its killed parent"


def test_exits_at_once_when_the_parent_is_already_gone() -> None:
    code = "from imgpipe._sys.procs import die_with_parent; die_with_parent(1); print('alive')"
    # the parent of this interpreter is not pid 1, so it must exit with status 1 and print nothing
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""


ORPHANS = """
import os, signal, subprocess, sys
import psutil
from imgpipe._sys.procs import ending_orphans

LEAVES_ONE = "import os, signal\\nif os.fork() == 0:\\n    os.closerange(0, 3)\\n    os.kill(os.getpid(), signal.SIGSTOP)"
with ending_orphans("IMGPIPE_TEST_RUN", "mine"):
    other = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait(60)"])  # not the block's
    marked = {**os.environ, "IMGPIPE_TEST_RUN": "mine"}
    middle = subprocess.run([sys.executable, "-c", LEAVES_ONE], env=marked, capture_output=True, text=True, check=True)
    orphan = next(p for p in psutil.Process().children() if p.pid not in (other.pid,))  # what the middle one left
    print(orphan.ppid() == os.getpid(), flush=True)  # adopted here, not by init
print(psutil.pid_exists(orphan.pid), other.poll() is None, flush=True)  # ended and reaped; the other left alone
other.kill()
"""


@pytest.mark.timeout(60)
def test_what_a_dead_child_leaves_behind_is_adopted_and_ended_and_nothing_else() -> None:
    done = subprocess.run([sys.executable, "-c", ORPHANS], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "True"]
