"""output.dir: a path that cannot be a folder is one error before any data is opened; a rerun of `imgpipe train`
never destroys the run there: refused without --resume, started afresh with --overwrite."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from train_cli import SYNTHETIC, imgpipe_train, one_line_error, write_config

from imgpipe.errors import ConfigError
from imgpipe.train.config import load_config
from imgpipe.train.rundir import make_output_dir


@pytest.mark.parametrize(("below", "problem"), [("", "is a file, not a folder"), ("run", "cannot create it (Not a directory)")])
def test_an_output_dir_that_cannot_be_a_folder_is_one_config_error(tmp_path: Path, below: str, problem: str) -> None:
    """``make_output_dir``, which ``imgpipe train`` calls before it opens any data (train/rundir.py)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    folder = a_file / below if below else a_file
    with pytest.raises(ConfigError, match=f"^output.dir {re.escape(str(folder))}: {re.escape(problem)}; choose another output.dir$"):
        make_output_dir(load_config(None, [f"output.dir={folder}"]))
    assert a_file.read_text() == ""


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
