"""The checkpoint file: atomic writes, a round trip that loads with weights_only, RNG states, and refusals."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from imgpipe.errors import ConfigError
from imgpipe.train.checkpoint_file import load_checkpoint, rng_state, save_checkpoint, set_rng_state


def test_checkpoint_round_trip_with_weights_only_and_rng(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    model = torch.nn.Linear(3, 2)
    state = {"model": model.state_dict(), "epoch": 2, "epoch_step": 5, "step": 25, "world_size": 1, "loader": {"epoch": 2, "batches": 5}}
    state["rng"] = [rng_state(torch.device("cpu"))]
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    loaded = load_checkpoint(path)  # torch.load(weights_only=True) inside
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp file left
    assert loaded["epoch"] == 2 and loaded["loader"] == {"epoch": 2, "batches": 5}
    assert all(torch.equal(loaded["model"][k], v) for k, v in model.state_dict().items())
    assert "cuda" not in loaded["rng"][0]  # a CUDA rank saves its own GPU's generator only (tools/gpu_check.sh resumes one)
    set_rng_state(loaded["rng"][0], torch.device("cpu"))
    again = (random.random(), np.random.rand(), torch.rand(1))
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])


def test_unreadable_checkpoint_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="not a readable imgpipe checkpoint"):
        load_checkpoint(tmp_path / "checkpoint.pt")
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        load_checkpoint(tmp_path / "missing.pt")


class Sneaky:
    """Anything that is not a tensor, number, string or container must not unpickle from a checkpoint."""


def test_checkpoint_with_arbitrary_objects_is_refused(tmp_path: Path) -> None:
    torch.save({"format_version": 1, "payload": Sneaky()}, tmp_path / "checkpoint.pt")
    with pytest.raises(ConfigError, match="not a readable imgpipe checkpoint"):
        load_checkpoint(tmp_path / "checkpoint.pt")


@pytest.mark.parametrize(
    ("name", "value"),
    [("world_size", 0), ("world_size", -2), ("world_size", 2.0), ("world_size", "2"), ("world_size", True), ("global_batch", 0),
     ("global_batch", 1e30), ("step", -1), ("epoch", -3)],
)  # fmt: skip
def test_a_checkpoint_whose_counts_are_not_counts_is_one_line(tmp_path: Path, name: str, value: object) -> None:
    """A world_size of 0 was a ZeroDivisionError when the run resumed; every count resuming divides or steps by is checked on load."""
    state = {"model": {}, "epoch": 1, "epoch_step": 0, "step": 10, "world_size": 2, "global_batch": 8}
    path = save_checkpoint(tmp_path / "checkpoint.pt", {**state, name: value})
    with pytest.raises(ConfigError) as info:
        load_checkpoint(path)
    assert str(info.value) == (
        f"{path}: the checkpoint {name} is {value!r}, not a count of {0 if name in ('epoch', 'step') else 1} or more: it is damaged "
        "or not written by imgpipe train; restore it from a copy, or move it away and train without --resume"
    )
    assert load_checkpoint(save_checkpoint(tmp_path / "good.pt", state))["world_size"] == 2
    older = {key: value for key, value in state.items() if key != "global_batch"}  # written before resume-anywhere: loads
    assert "global_batch" not in load_checkpoint(save_checkpoint(tmp_path / "older.pt", older))
    without = {key: value for key, value in state.items() if key != "world_size"}
    with pytest.raises(ConfigError, match="the checkpoint lacks its world_size: it is damaged or not written by imgpipe train"):
        load_checkpoint(save_checkpoint(tmp_path / "without.pt", without))
