"""Two gloo ranks on this machine, each a real process running a test's script."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(script: Path, out_dir: Path, timeout: float) -> list[dict[str, np.ndarray]]:
    """Run ``script RANK OUT.npz`` for ranks 0 and 1 at once, with no launcher's variables; both must
    exit 0. Each rank's saved arrays, in rank order."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARIABLES}
    outputs = [out_dir / f"r{rank}.npz" for rank in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for rank, out in enumerate(outputs)
    ]
    outs = [p.communicate(timeout=timeout) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return [dict(np.load(out)) for out in outputs]
