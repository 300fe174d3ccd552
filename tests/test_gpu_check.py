"""tools/gpu_check.sh dry-run on the CPU (GPU_CHECK_GPUS=0, resnet18 at 32 and 40 px, 20 images), so the script cannot rot.

On a GPU it may get one run; these runs make sure that run reports every step and fails loudly.
"""

from __future__ import annotations

import os
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
    "GPU_CHECK_SIZES": "32 40",
    "GPU_CHECK_VAL_SIZE": "48",
    "GPU_CHECK_PER_CLASS": "2",
    "GPU_CHECK_VAL_PER_CLASS": "3",
    "GPU_CHECK_MIN_SIDE": "48",
    "GPU_CHECK_MAX_SIDE": "64",
    "GPU_CHECK_BENCH_STEPS": "3",
    "GPU_CHECK_WORKERS": "1",
    "GPU_CHECK_RESUME_AT": "1",
    "GPU_CHECK_DALI": "0",
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu-check")  # shared: the second run reuses the packed data


def dry_run(work: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "GPU_CHECK_"))}
    env.update(TINY, PYTHON=sys.executable, GPU_CHECK_WORK=str(work), OMP_NUM_THREADS="1", **extra)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=280)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dry_run_passes_every_step_and_reports_them(work: Path) -> None:
    done = dry_run(work)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = (work / "gpu_check.txt").read_text()
    assert "JPEG decoding: " in report
    names = ("ceiling-32", "torch-32", "ceiling-40", "torch-40", "ramp", "fp16", "resume")
    rows = {line.split()[0]: line for line in report.splitlines() if line.split()[:1] and line.split()[0] in names}
    assert set(rows) == set(names), report
    for size in (32, 40):
        assert f"{size} none, NCHW" in rows[f"ceiling-{size}"] and f"{size} none, NCHW" in rows[f"torch-{size}"]  # auto on the CPU
        assert rows[f"torch-{size}"].split()[6] == "30"  # every val record, 3 full batches of 8 and one of 6
        assert "rank 0:" in rows[f"torch-{size}"]  # data-wait per rank
        assert f"loader at {size} px: " in report and "x the in-memory ceiling" in report
    assert "fp16, NCHW" in rows["fp16"]
    assert "ramp     epochs at [32, 40] px, validated at 48 px with flip TTA: top-1 " in report and "EMA top-1 " in report
    assert "spawn    done: 1 epoch(s), 2 steps in a spawned rank" in report
    assert "bench    verdict: " in report
    assert "gpu_check: every step passed" in report
    assert "resumed from" in (work / "run-resume.err").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_model_that_does_not_exist_fails_every_run_and_the_script(work: Path) -> None:
    done = dry_run(work, GPU_CHECK_MODEL="nosuchnet")
    assert done.returncode == 1, done.stdout[-3000:]
    failed = [line for line in done.stdout.splitlines() if line.startswith("gpu_check: FAILED: ")]
    assert [line.split()[2] for line in failed] == [
        "ceiling-32",
        "torch-32",
        "ceiling-40",
        "torch-40",
        "ramp",
        "fp16",
        "resume",
        "spawn",
        "bench",
    ], done.stdout[-3000:]
    assert "every step passed" not in done.stdout
