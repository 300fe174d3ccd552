"""A full or read-only disk under `imgpipe train` is one line naming the file and what to do, not torch's traceback.

Real file systems: a small tmpfs (a real ENOSPC), a read-only one (a real EROFS); root only, else skipped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _fs import fill, tmpfs
from train_cli import SYNTHETIC, imgpipe_train, one_line_error, write_config


@pytest.mark.timeout(240)
def test_a_full_disk_while_writing_a_checkpoint_or_metrics_is_one_line(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed, max_steps=1)
    with tmpfs(tmp_path / "disk", "2m") as disk:  # config.yaml and metrics fit; resnet18's 45 MB checkpoint does not
        run = disk / "run"
        done = imgpipe_train(config, *SYNTHETIC, "--set", f"output.dir={run}")
        one_line_error(
            done,
            f"{run}/checkpoint.pt: cannot write the checkpoint: No space left on device (ENOSPC); free space there",
            "another file system",
            "--resume",
        )
        assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl"]  # no half-written checkpoint left
        shutil.rmtree(run)
        fill(disk, leave_pages=1)  # one page: config.yaml takes it, the first metrics line finds none
        done = imgpipe_train(config, *SYNTHETIC, "--set", f"output.dir={run}", "--set", "train.log_every=1")
        one_line_error(done, f"{run}/metrics.jsonl: cannot write metrics: No space left on device (ENOSPC)")


@pytest.mark.timeout(120)
def test_a_read_only_output_dir_is_named_as_such(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed, max_steps=1)
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        done = imgpipe_train(config, *SYNTHETIC, "--set", f"output.dir={ro}")
        one_line_error(done, f"output.dir {ro}: cannot write there: Read-only file system (EROFS); the file system is mounted read-only")
