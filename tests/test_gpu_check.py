"""tools/gpu_check.sh dry-run on the CPU (GPU_CHECK_GPUS=0, resnet18 at 32 (and 40) px, 20 images), so the script cannot rot.

On a GPU it may get one run; these runs make sure that it honours small sizes, keeps to its time
budget, reports every step, skips with a line what only means anything on a GPU, and fails loudly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.sh"
LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OUT"}
TINY = {
    "GPU_CHECK_GPUS": "0",
    "GPU_CHECK_MODEL": "resnet18",
    "GPU_CHECK_BATCH": "8",
    "GPU_CHECK_IMAGE_SIZE": "32",  # the one training size; the validation size (48) and the images' sides follow it
    "GPU_CHECK_PER_CLASS": "2",
    "GPU_CHECK_VAL_PER_CLASS": "3",
    "GPU_CHECK_BENCH_STEPS": "3",
    "GPU_CHECK_WORKERS": "1",
    "GPU_CHECK_RESUME_AT": "1",
    "GPU_CHECK_DALI": "0",
}
BUDGET_S = 250  # the dry run's GPU_CHECK_BUDGET: a step that would end later fails


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu-check")  # shared: the second run reuses the packed data


def dry_run(work: Path, timeout: float = BUDGET_S + 40, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "GPU_CHECK_"))}
    env.update(TINY, GPU_CHECK_BUDGET=str(BUDGET_S), PYTHON=sys.executable, GPU_CHECK_WORK=str(work), OMP_NUM_THREADS="1")
    env.update(extra)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dry_run_at_a_small_size_passes_every_step_within_its_budget_and_reports_them(work: Path) -> None:
    done = dry_run(work)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = (work / "gpu_check.txt").read_text()
    assert "JPEG decoding: " in report
    names = ("ceiling-32", "torch-32", "ramp", "fp16", "resume")
    rows = {line.split()[0]: line for line in report.splitlines() if line.split()[:1] and line.split()[0] in names}
    assert set(rows) == set(names), report
    assert "32 none, NCHW" in rows["ceiling-32"] and "32 none, NCHW" in rows["torch-32"]  # GPU_CHECK_IMAGE_SIZE, auto on the CPU
    assert rows["torch-32"].split()[6] == "30"  # every val record, 3 full batches of 8 and one of 6
    assert "rank 0:" in rows["torch-32"]  # data-wait per rank
    assert "loader at 32 px: " in report and "x the in-memory ceiling" in report
    # fp16 autocast on the CPU measures nothing (and crawls): skipped, saying so, not failed
    assert rows["fp16"].split(None, 1)[1].startswith("skipped: fp16 autocast and its gradient scaler only mean anything on a GPU")
    assert "gpu_check: skipped fp16: " in done.stdout
    assert "ramp     epochs at [32] px, validated at 48 px with flip TTA: top-1 " in report and "EMA top-1 " in report
    assert "gpu_check: the ramp runs without torch.compile here" in done.stdout
    assert "spawn    done: 1 epoch(s), 2 steps in a spawned rank" in report
    assert "bench    verdict: " in report
    assert "gpu_check: every step passed" in report
    assert "resumed from" in (work / "run-resume.err").read_text()
    total = int(re.search(r"; total (\d+)s", report).group(1))
    assert total <= BUDGET_S


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_model_that_does_not_exist_fails_every_run_and_the_script(work: Path) -> None:
    done = dry_run(work, GPU_CHECK_MODEL="nosuchnet", GPU_CHECK_SIZES="32 40")
    assert done.returncode == 1, done.stdout[-3000:]
    failed = [line for line in done.stdout.splitlines() if line.startswith("gpu_check: FAILED: ")]
    assert [line.split()[2] for line in failed] == [
        "ceiling-32",
        "torch-32",
        "ceiling-40",
        "torch-40",
        "ramp",
        "resume",
        "spawn",
        "bench",
    ], done.stdout[-3000:]
    assert "every step passed" not in done.stdout


@pytest.mark.timeout(120)
def test_steps_the_budget_has_no_time_left_for_are_not_started_and_fail(tmp_path: Path) -> None:
    done = dry_run(tmp_path, timeout=100, GPU_CHECK_BUDGET="1")
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-2000:]  # the data step did not run: nothing else can
    assert "gpu_check: FAILED data: not run, the 1s of GPU_CHECK_BUDGET are spent" in done.stdout, done.stdout[-3000:]
    assert not (tmp_path / "packed").exists()
