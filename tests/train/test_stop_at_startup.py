"""SIGTERM or Ctrl-C at any moment of `imgpipe train`'s start-up exits 143 or 130, as a stop, not 1 as a failure.

A preemption wrapper (SLURM requeue, a spot-instance script) tells a stopped job from a failed
one by that code. Real runs, signalled while the launcher spawns its ranks, while their interpreters
still import site, while the ranks import torch and build the model, and just after they built it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proctree import descendants, quiet_env, rank_processes, wait_gone
from train_cli import SYNTHETIC, write_config


def wait_until(proc: subprocess.Popen, ready, timeout: float = 120) -> set[int]:
    """Poll until ``ready()``; return every descendant of ``proc`` seen meanwhile."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while not ready():
        seen.update(descendants(proc.pid))
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "start-up did not reach the moment to signal"
        time.sleep(0.02)
    seen.update(descendants(proc.pid))
    return seen


SLOW_SITE = (
    "import os, pathlib, time\n"
    "marks = os.environ.get('IMGPIPE_TEST_SLOW_SITE')\n"
    "argv = open('/proc/self/cmdline').read().split(chr(0))\n"
    "if marks and 'imgpipe.train.rank_main' in argv:\n"
    "    open(f'{marks}/{os.getpid()}', 'w').close()\n"
    "    stop = pathlib.Path(argv[argv.index('imgpipe.train.rank_main') + 1]) / 'stop'\n"
    "    deadline = time.monotonic() + 60  # held, as on a slow shared home, until the launcher asks the ranks to stop\n"
    "    while not stop.exists() and time.monotonic() < deadline:\n"
    "        time.sleep(0.02)\n"
)


def slow_interpreter_start(tmp_path: Path) -> dict[str, str]:
    """Environment in which a spawned rank is held in ``sitecustomize`` (as on a slow shared home) until the launcher
    stops it, marking itself there."""
    site = tmp_path / "slow-site"
    (site / "marks").mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SLOW_SITE)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "IMGPIPE_TEST_SLOW_SITE": str(site / "marks")}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("signum", "moment", "nproc"),
    [
        (signal.SIGTERM, "spawned", 2),  # the ranks exist, still importing torch
        (signal.SIGTERM, "built", 2),  # the model is built (config.yaml written), the first steps not run
        (signal.SIGINT, "spawned", 2),  # Ctrl-C in a terminal: to the launcher's process group (the ranks have their own)
        (signal.SIGINT, "interpreter", 2),  # Ctrl-C while the ranks' interpreters still import site: no handler can run yet
        (signal.SIGTERM, "importing", 1),  # one process: the launcher is the rank
    ],
)
def test_a_signal_during_start_up_exits_as_a_stop(packed: Path, tmp_path: Path, signum: int, moment: str, nproc: int) -> None:
    config = write_config(tmp_path, packed, workers=1, epochs=50, validate=False)
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), *SYNTHETIC, "--gpus", "0", "--nproc", str(nproc)]
    env = quiet_env(**(slow_interpreter_start(tmp_path) if moment == "interpreter" else {}))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if moment == "spawned":
            seen = wait_until(proc, lambda: len(rank_processes(proc.pid)) == nproc)
        elif moment == "interpreter":
            marks = Path(env["IMGPIPE_TEST_SLOW_SITE"])
            seen = wait_until(
                proc, lambda: len(rank_processes(proc.pid)) == nproc and all((marks / str(p)).exists() for p in rank_processes(proc.pid))
            )
        elif moment == "built":
            seen = wait_until(proc, lambda: (tmp_path / "run" / "config.yaml").exists())
        else:
            seen = wait_until(proc, lambda: "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text())  # importing torch
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr and "imgpipe: error" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"imgpipe: stopped by {signal.Signals(signum).name}"), stderr[-3000:]
    assert "exited with code" not in last, last  # a rank stopped as it started is a stop, not a rank that exited on its own
    assert wait_gone(sorted(seen), 20) == []  # no rank or worker outlives the launcher


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_while_a_rank_ends_is_not_a_traceback(signum: int) -> None:
    """A rank stopped before it registered ends at once; a second signal (a second Ctrl-C) while it ended its workers,
    importing psutil, unwound that with a traceback of Stopped among the launcher's lines."""
    signal_while_ending = (
        "import importlib.abc, signal, sys\n"
        "from imgpipe.train import rank_main\n"
        "class Hook(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'psutil':\n"
        "            sys.meta_path.remove(self)\n"
        f"            signal.raise_signal({int(signum)})\n"
        "sys.meta_path.insert(0, Hook())\n"
        "for signum in rank_main.STOP_SIGNALS:\n"
        "    signal.signal(signum, rank_main._stop_now)\n"
        "assert 'psutil' not in sys.modules\n"
        "rank_main._exit_now(143)\n"
    )
    done = subprocess.run([sys.executable, "-c", signal_while_ending], capture_output=True, text=True, timeout=50)
    assert (done.returncode, done.stderr) == (143, "")
