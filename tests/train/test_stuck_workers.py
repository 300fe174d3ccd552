"""`imgpipe train` whose loader workers stop answering (a read on a hung mount; here SIGSTOP, through the test hook
IMGPIPE_TEST_STUCK_READS) still stops on SIGTERM: within the grace, at once on a second one, with one line and 143,
and nothing of the run left running, the stuck workers included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hooks.faults import STUCK_READS_ENV, hook_env
from proctree import descendants, quiet_env, stopped, wait_gone
from train_cli import write_config

ENDED_WITHIN_S = 30  # from the second SIGTERM: killing the processes and exiting, on a loaded machine


def start_stuck_run(config: Path, *launch: str) -> subprocess.Popen:
    env = hook_env(quiet_env(), **{STUCK_READS_ENV: "1"})
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0", *launch]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_stuck_workers(proc: subprocess.Popen, count: int, timeout: float = 240) -> set[int]:
    """Wait until ``count`` loader workers are stopped; every descendant seen meanwhile."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while sum(stopped(pid) for pid in descendants(proc.pid)) < count:
        seen.update(descendants(proc.pid))
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the loader workers did not get stuck"
        time.sleep(0.05)
    return seen | set(descendants(proc.pid))


def kill_all(proc: subprocess.Popen) -> None:
    """Leave nothing behind when a check failed."""
    for pid in [*descendants(proc.pid), proc.pid] if proc.poll() is None else []:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_twice(proc: subprocess.Popen, announced: str) -> str:
    """SIGTERM, then SIGTERM again once ``announced`` is on stderr; the rest of stderr."""
    proc.send_signal(signal.SIGTERM)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if announced in line:
            break
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, rest = proc.communicate(timeout=ENDED_WITHIN_S + 60)
    assert time.monotonic() - start < ENDED_WITHIN_S, "the second SIGTERM did not end the run at once"
    return "".join(lines) + rest


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_one_process_whose_worker_is_stuck_ends_on_a_second_sigterm(packed: Path, tmp_path: Path) -> None:
    proc = start_stuck_run(write_config(tmp_path, packed, workers=1, epochs=50, validate=False))
    try:
        seen = wait_for_stuck_workers(proc, 1)
        stderr = stop_twice(proc, "got SIGTERM: stopping at the next step")
    finally:
        kill_all(proc)
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "imgpipe: stopped by SIGTERM", stderr[-3000:]
    assert wait_gone(sorted(seen), 10) == []  # the stopped worker too


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ranks_whose_workers_are_stuck_are_ended_whole_on_a_second_sigterm(packed: Path, tmp_path: Path) -> None:
    """The launcher never exited: it waited on pipes the ranks' stuck workers held, and left them orphaned under init."""
    proc = start_stuck_run(write_config(tmp_path, packed, workers=1, epochs=50, validate=False), "--nproc", "2")
    try:
        seen = wait_for_stuck_workers(proc, 2)
        stderr = stop_twice(proc, "got SIGTERM: asking every rank to stop")
    finally:
        kill_all(proc)
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("imgpipe: stopped by SIGTERM"), stderr[-3000:]
    assert wait_gone(sorted(seen), 10) == []  # ranks and their stopped workers: no zombie, no orphan under init


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_one_process_whose_worker_is_stuck_ends_on_sighup_with_one_line(packed: Path, tmp_path: Path) -> None:
    """SIGHUP (the terminal closed) killed the process without a word, 129 as -1, and left the stopped worker under init;
    then, once handled, its line came twice: printed as the command unwound, again at the grace the stuck worker ran to."""
    proc = start_stuck_run(write_config(tmp_path, packed, workers=1, epochs=50, validate=False))
    try:
        seen = wait_for_stuck_workers(proc, 1)
        proc.send_signal(signal.SIGHUP)
        _, stderr = proc.communicate(timeout=ENDED_WITHIN_S + 60)
    finally:
        kill_all(proc)
    assert proc.returncode == 129, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert [line for line in stderr.splitlines() if "stopped by" in line] == ["imgpipe: stopped by SIGHUP"], stderr[-3000:]
    assert wait_gone(sorted(seen), 10) == []
