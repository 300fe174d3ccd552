"""Checks shared by the tests that run the real CLI in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("imgpipe: error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def run_in_group(command: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True)`` in a process group of its own, killed whole when
    the command ends or times out (or the test is stopped): no rank or worker it started outlives the test."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if process.poll() is None:
            process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def slow_pack_command(src: Path, dst: Path, program: tuple[str, ...] = ("-m", "imgpipe"), *options: str) -> list[str]:
    """``imgpipe pack`` resizing into 8 shards with 2 workers: each shard takes a while, so a kill lands mid-work."""
    slow = ("--shards", "8", "--resize", "64", "--workers", "2", "--no-progress")
    return [sys.executable, *program, "pack", str(src), str(dst), *slow, *options]


STEP_S = 0.002  # how long the command runs between two stops


def kill_once_durable(command: list[str], durable: Callable[[], bool], env: dict[str, str] | None = None) -> None:
    """Run ``command`` a few milliseconds at a time (SIGCONT, sleep, SIGSTOP to its process group, workers included)
    and kill -9 it at the first stop where ``durable()`` holds: mid-pack, however fast or loaded the machine."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.monotonic() + 180
    try:
        while True:
            time.sleep(STEP_S)
            os.killpg(process.pid, signal.SIGSTOP)
            if durable():
                return
            assert process.poll() is None, "the pack ended before any of its work was durable"
            assert time.monotonic() < deadline, "no work became durable in 180 s"
            os.killpg(process.pid, signal.SIGCONT)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
