"""Failures raised inside a real `imgpipe train` run (the test hook IMGPIPE_TRAIN_FAULT_RANK<r>) come back as one named line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hooks.faults import TRAIN_FAULT_ENV, hook_env
from proctree import descendants, quiet_env, wait_gone
from train_cli import SYNTHETIC, VAL_RECORDS, imgpipe_train, one_line_error, write_config

TWO_RANKS = ("--gpus", "0", "--nproc", "2")


def faulty(**kinds: str) -> dict[str, str]:
    """quiet_env with the hook set: faulty(rank1="oom")."""
    return hook_env(quiet_env(), **{TRAIN_FAULT_ENV.format(rank=int(key[4:])): kind for key, kind in kinds.items()})


@pytest.mark.timeout(240)
def test_out_of_memory_in_the_forward_pass_is_the_one_line_advice(packed: Path, tmp_path: Path) -> None:
    done = imgpipe_train(write_config(tmp_path, packed, max_steps=3), *SYNTHETIC, "--set", "train.batch_size=8", env=faulty(rank0="oom"))
    one_line_error(done, "rank 0: CUDA out of memory with train.batch_size=8 per process, model resnet18", "lower train.batch_size")


@pytest.mark.timeout(240)
def test_an_illegal_memory_access_is_not_reported_as_out_of_memory(packed: Path, tmp_path: Path) -> None:
    """On a GPU the hook makes a real illegal memory access; here it raises what torch raised for one on an H200."""
    done = imgpipe_train(write_config(tmp_path, packed, max_steps=3), *SYNTHETIC, env=faulty(rank0="illegal-address"))
    line = one_line_error(done, "rank 0: CUDA error 'illegal memory access' in model resnet18", "sticky", "CUDA_LAUNCH_BLOCKING=1")
    assert "lower train.batch_size" not in line


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_unused_parameters_in_two_ranks_is_the_one_line_advice(packed: Path, tmp_path: Path) -> None:
    done = imgpipe_train(
        write_config(tmp_path, packed, max_steps=3), *SYNTHETIC, *TWO_RANKS, env=faulty(rank0="unused-parameter", rank1="unused-parameter")
    )
    one_line_error(done, "DDP found parameters of model 'resnet18' that got no gradient", "train.find_unused_parameters: true")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_validation_that_misses_samples_fails_the_run(packed: Path, tmp_path: Path) -> None:
    # rank 1 validates 20 records in batches of 16 and 4, and leaves out the 4
    done = imgpipe_train(write_config(tmp_path, packed, epochs=1), *TWO_RANKS, env=faulty(rank1="short-val"))
    one_line_error(done, f"validation saw {VAL_RECORDS - 4} samples but split 'val'", f"has {VAL_RECORDS} records")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_hangs_is_named_not_the_healthy_one_that_timed_out(packed: Path, tmp_path: Path) -> None:
    """Rank 1 stops in its second forward pass; rank 0 waits in the all-reduce until train.timeout_s."""
    config = write_config(tmp_path, packed, workers=1, epochs=1, timeout_s=10)
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), *TWO_RANKS]
    proc = subprocess.Popen(cmd, env=faulty(rank1="hang"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:  # every rank and loader worker that ever ran
        seen.update(descendants(proc.pid))
        time.sleep(0.5)
    proc.wait(timeout=30)
    stderr = proc.stderr.read()
    assert proc.returncode == 1
    assert (
        stderr.strip()
        .splitlines()[-1]
        .startswith("imgpipe: error: rank 1 hung: it did not reach the collective that rank 0 waited in for 10 s")
    ), stderr[-3000:]
    assert "rank 0 failed" not in stderr and "Traceback" not in stderr
    assert len(seen) >= 4 and wait_gone(sorted(seen), 30) == []  # 2 ranks and their loader workers
