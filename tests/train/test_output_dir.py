"""A rerun of `imgpipe train` never destroys the run in output.dir: refused without --resume, started afresh with --overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_cli import SYNTHETIC, imgpipe_train, one_line_error, write_config


def step_lines(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]


@pytest.mark.timeout(240)
def test_a_rerun_without_resume_is_refused_and_overwrite_starts_afresh(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed, max_steps=2, tensorboard=True)
    run = tmp_path / "run"
    first = imgpipe_train(config, *SYNTHETIC)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint, metrics = (run / "checkpoint.pt").read_bytes(), (run / "metrics.jsonl").read_bytes()
    assert step_lines(run) == [1, 2]
    events = len(list((run / "tensorboard").glob("events.out.tfevents.*")))  # 1 when TensorBoard is installed

    again = imgpipe_train(config, *SYNTHETIC)  # the same job script, submitted again
    one_line_error(again, f"output.dir {run} already holds a run", "--resume", "--overwrite", "another output.dir")
    assert (run / "checkpoint.pt").read_bytes() == checkpoint and (run / "metrics.jsonl").read_bytes() == metrics

    one_line_error(imgpipe_train(config, *SYNTHETIC, "--resume", "--overwrite"), "--resume", "--overwrite", "not both")

    fresh = imgpipe_train(config, *SYNTHETIC, "--overwrite", "--set", "train.max_steps=1")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert step_lines(run) == [1]  # the old run's lines are gone, not appended to
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == events  # only the new run's
    assert list(run.glob(".*.tmp")) == []
    # the saved config still resumes the run: --overwrite is not carried into it
    resumed = imgpipe_train(run / "config.yaml", *SYNTHETIC, "--resume", "--set", "train.max_steps=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert step_lines(run) == [1, 2]
