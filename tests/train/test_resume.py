"""Resume on another rank count: the per-rank batch from the checkpoint's global batch, and the line that says so."""

from __future__ import annotations

import pytest

from imgpipe.errors import ConfigError
from imgpipe.train.config import load_config
from imgpipe.train.resume import resolve_batch, resume_line


def _saved(world: int, batch: int, *, epoch: int = 3, batches: int | None = 120, stored_g: bool = True) -> dict:
    saved = {"world_size": world, "epoch": epoch, "config": {"train": {"batch_size": batch}}, "loader": None}
    if batches is not None:
        saved["loader"] = {"epoch": epoch, "batches": batches, "global_batch": world * batch}
    if stored_g:
        saved["global_batch"] = world * batch
    return saved


@pytest.mark.parametrize("stored_g", [True, False])
def test_the_checkpoints_global_batch_sets_the_per_rank_batch(stored_g: bool) -> None:
    config = load_config(None, ["train.batch_size=64"])
    assert resolve_batch(config, 3, _saved(2, 6, stored_g=stored_g)).train.batch_size == 4
    assert resolve_batch(config, 12, _saved(2, 6, stored_g=stored_g)).train.batch_size == 1
    assert config.train.batch_size == 64  # the given config is left as it was


def test_global_batch_size_in_the_config_sets_the_per_rank_batch() -> None:
    assert resolve_batch(load_config(None, ["train.global_batch_size=256"]), 8, None).train.batch_size == 32
    assert resolve_batch(load_config(None, ["train.batch_size=5"]), 8, None).train.batch_size == 5  # unset: as given
    with pytest.raises(ConfigError, match="train.global_batch_size must be > 0 or null"):
        load_config(None, ["train.global_batch_size=0"])


def test_a_global_batch_that_does_not_split_is_one_line_naming_what_fits() -> None:
    with pytest.raises(ConfigError, match=r"the checkpoint's global batch 12 does not split over 5 ranks; .*12 on 1, 6 on 2, 4 on 3, 3 on 4, 2 on 6, 1 on 12 ranks"):
        resolve_batch(load_config(None), 5, _saved(2, 6))
    with pytest.raises(ConfigError, match=r"train.global_batch_size global batch 10 does not split over 3 ranks"):
        resolve_batch(load_config(None, ["train.global_batch_size=10"]), 3, None)
    with pytest.raises(ConfigError, match=r"train.global_batch_size is 24 but the checkpoint .* global batch 12"):
        resolve_batch(load_config(None, ["train.global_batch_size=24"]), 2, _saved(2, 6))


def test_the_resume_line_says_what_changed() -> None:
    assert resume_line(_saved(2, 6), 3, 4) == "resumed at epoch 3, global batch 120, on 3 ranks (was 2); per-rank batch 4 (was 6)"
    assert resume_line(_saved(2, 6, batches=None), 2, 6) == "resumed at epoch 3, global batch 0, on 2 ranks; per-rank batch 6"
