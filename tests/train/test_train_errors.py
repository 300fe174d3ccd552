"""A user's mistake in a real `imgpipe train` run is one line naming what to change, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_cli import imgpipe_train, write_config

SYNTHETIC = ("--set", "data.backend=synthetic", "--set", "train.validate=false")


def one_line_error(done, *words: str) -> str:
    """The stderr of a failed run: exactly one line, ``imgpipe: error: ...``, holding every word."""
    assert done.returncode != 0, done.stdout[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("imgpipe: error:")]
    assert len(errors) == 1 and len(done.stderr.strip().splitlines()) <= 3, done.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


@pytest.mark.timeout(240)
def test_resume_with_another_model_or_class_count_is_one_line(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed, max_steps=1)
    first = imgpipe_train(config, *SYNTHETIC)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    other_model = imgpipe_train(config, *SYNTHETIC, "--resume", "--set", "model.name=resnet34")
    one_line_error(other_model, str(checkpoint), "model resnet18 with 4 classes", "asks for resnet34 with 4")
    other_classes = imgpipe_train(config, *SYNTHETIC, "--resume", "--set", "model.num_classes=10")
    one_line_error(other_classes, "model resnet18 with 4 classes", "asks for resnet18 with 10")
    # a checkpoint from before the class count was stored: the weights themselves do not fit
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    del state["num_classes"]
    torch.save(state, checkpoint)
    older = imgpipe_train(config, *SYNTHETIC, "--resume", "--set", "model.num_classes=10")
    one_line_error(older, "the checkpoint's weights do not fit model resnet18 with 10 classes")
