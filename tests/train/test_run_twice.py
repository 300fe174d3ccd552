"""A library call leaves the process as it found it: train.run() twice in one interpreter, Ctrl-C in the first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from proctree import quiet_env

HERE = Path(__file__).parent


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_run_after_a_ctrl_c_trains_to_the_end_and_the_process_is_as_before(packed: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "run_twice.py"), str(packed), str(tmp_path)],
        env=quiet_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    stopped_by, step = seen["first"]
    assert stopped_by == "SIGINT" and step >= 1
    assert seen["second"] == [None, 10, 1], seen  # 160 records / batch 16: all 10 steps, not stopped at step 1
    assert seen["after"]["sigint"] == repr(__import__("signal").default_int_handler)
    assert seen["environ_diff"] == []  # CUBLAS_WORKSPACE_CONFIG (train.deterministic) is gone again
    assert all(seen["between_same"].values()) and all(seen["after_same"].values()), (seen["before"], seen["after"])
