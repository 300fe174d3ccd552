"""Resume on another rank count: the per-rank batch from the checkpoint's global batch, and the line that says so."""

from __future__ import annotations

import pytest

from imgpipe.errors import ConfigError
from imgpipe.loaders.sampler import rank_indices
from imgpipe.train.config import load_config
from imgpipe.train.resume import Position, resolve_batch, resume_line, resume_position


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
    with pytest.raises(
        ConfigError,
        match=r"the checkpoint's global batch 12 does not split over 5 ranks; .*12 on 1, 6 on 2, 4 on 3, 3 on 4, 2 on 6, 1 on 12 ranks",
    ):
        resolve_batch(load_config(None), 5, _saved(2, 6))
    with pytest.raises(ConfigError, match=r"train.global_batch_size global batch 10 does not split over 3 ranks"):
        resolve_batch(load_config(None, ["train.global_batch_size=10"]), 3, None)


def test_a_changed_batch_request_changes_the_global_batch_and_a_stale_file_does_not() -> None:
    """The checkpoint keeps the batch its run was given: (batch_size 4, no global), run on 4 ranks, G = 16."""
    saved = {**_saved(4, 4), "batch_request": {"batch_size": 4, "global_batch_size": None}}
    same_file = load_config(None, ["train.batch_size=4"])  # resumed on 2 ranks, then again: G stays 16
    assert resolve_batch(same_file, 2, {**saved, "world_size": 2, "config": {"train": {"batch_size": 8}}}).train.batch_size == 8
    resolved = resolve_batch(same_file, 2, saved)  # what the resumed run saves as its config.yaml
    assert (resolved.train.batch_size, resolved.train.global_batch_size) == (8, 16)
    assert resolve_batch(resolved, 1, saved).train.batch_size == 16  # resuming from config.yaml keeps G too
    assert resolve_batch(load_config(None, ["train.batch_size=6"]), 2, saved).train.batch_size == 6  # G 12 now
    assert resolve_batch(load_config(None, ["train.batch_size=4", "train.global_batch_size=24"]), 2, saved).train.batch_size == 12
    older = _saved(2, 6)  # written before the request was stored: only global_batch_size can change G
    assert resolve_batch(load_config(None, ["train.batch_size=64"]), 2, older).train.batch_size == 6
    assert resolve_batch(load_config(None, ["train.global_batch_size=24"]), 2, older).train.batch_size == 12


def test_the_resume_line_says_what_changed() -> None:
    assert resume_line(_saved(2, 6), 3, 4) == "resumed at epoch 3, global batch 120, on 3 ranks (was 2); per-rank batch 4 (was 6)"
    assert resume_line(_saved(2, 6, batches=None), 2, 6) == "resumed at epoch 3, global batch 0, on 2 ranks; per-rank batch 6"


def _mid_epoch(
    global_batch: int, accum: int, batches: int, *, epoch: int = 1, steps_per_epoch: int = 10, seed: int = 0, records: int = 160
) -> dict:
    """A checkpoint saved mid-epoch: ``batches`` global batches of G = ``global_batch`` read, in steps of ``accum`` of them."""
    return {
        "epoch": epoch,
        "epoch_step": batches // accum,
        "step": epoch * steps_per_epoch + batches // accum,
        "world_size": 1,
        "global_batch": global_batch,
        "config": {"train": {"batch_size": global_batch, "grad_accum": accum}},
        "loader": {"epoch": epoch, "batches": batches, "seed": seed, "records": records, "global_batch": global_batch},
    }


def _config(batch: int, accum: int, seed: int = 0):
    return load_config(None, [f"train.batch_size={batch}", f"train.grad_accum={accum}", f"train.seed={seed}"])


def _position(saved: dict, batch: int, accum: int, records: int = 160, seed: int = 0):
    steps = records // batch // accum
    return resume_position(saved, _config(batch, accum, seed), global_batch=batch, steps_per_epoch=steps, records=records, path="ckpt.pt")


def test_a_position_converts_to_another_grad_accum_or_global_batch_on_a_step_boundary() -> None:
    assert _position(_mid_epoch(16, 1, 4), 16, 2) == Position(1, 2, 1 * 5 + 2, _mid_epoch(16, 1, 4)["loader"])  # 4 batches: 2 steps of 2
    assert _position(_mid_epoch(16, 2, 4), 16, 1).epoch_step == 4  # not 2: no batch is read twice
    moved = _position(_mid_epoch(16, 1, 6), 32, 1)  # 96 records: 3 batches of 32
    assert (moved.epoch_step, moved.step, moved.loader["batches"], moved.loader["global_batch"]) == (3, 5 + 3, 3, 32)
    assert _position(_mid_epoch(16, 1, 6), 16, 1).step == 16  # unchanged: the step as saved
    at_epoch_end = {**_mid_epoch(16, 1, 0), "loader": None}
    assert _position(at_epoch_end, 48, 3) == Position(1, 0, 1, None)  # 160 // 48 // 3 = 1 step per epoch


def test_the_converted_position_reads_the_records_an_uninterrupted_epoch_had_left() -> None:
    """The order of an epoch does not depend on G: the records after r of them are the same in any G's stream."""
    moved = _position(_mid_epoch(16, 1, 6), 32, 1)
    before = rank_indices(160, seed=0, epoch=1, rank=0, world_size=1, batch_size=16)
    after = rank_indices(160, seed=0, epoch=1, rank=0, world_size=1, batch_size=32)
    assert after[moved.loader["batches"] * 32 :].tolist() == before[6 * 16 :].tolist()


def test_a_position_between_new_steps_or_in_another_stream_is_one_line_saying_what_to_do() -> None:
    with pytest.raises(
        ConfigError,
        match=r"ckpt.pt: cannot resume with global batch 16 x train.grad_accum 2 = 32 records per step: "
        r"the checkpoint stopped in epoch 1 after 80 records.*train.max_steps: 20\)",
    ):
        _position(_mid_epoch(16, 1, 5), 16, 2)
    with pytest.raises(ConfigError, match=r"in the record order of train.seed 0, but train.seed is 7; resume with train.seed: 0"):
        _position(_mid_epoch(16, 1, 4), 16, 1, seed=7)
    with pytest.raises(
        ConfigError, match=r"a train split of 160 records, but split 'train' of  has 150; resume with the data it was trained on"
    ):
        _position(_mid_epoch(16, 1, 4), 16, 1, records=150)
