"""A user's mistake in a real `imgpipe train` run is one line naming what to change, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_cli import SYNTHETIC, imgpipe_train, one_line_error, write_config


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


@pytest.mark.timeout(240)
def test_a_corrupt_checkpoint_is_one_line_that_never_suggests_weights_only_false(packed: Path, tmp_path: Path) -> None:
    import pickle

    config = write_config(tmp_path, packed, max_steps=1)
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    checkpoint.parent.mkdir(parents=True)
    for content in (b"not a zip file at all", pickle.dumps({"model": Path("/x")})):  # garbage; a pickle torch's safe loader refuses
        checkpoint.write_bytes(content)
        done = imgpipe_train(config, *SYNTHETIC, "--resume")
        line = one_line_error(done, str(checkpoint), "not a readable imgpipe checkpoint", "train without --resume")
        assert "weights_only" not in done.stderr and "weights_only" not in line


@pytest.mark.timeout(240)
def test_a_typo_in_val_split_fails_naming_the_splits(packed: Path, tmp_path: Path) -> None:
    done = imgpipe_train(write_config(tmp_path, packed, max_steps=1), "--set", "data.val_split=vall")
    one_line_error(done, f"{packed}: no split 'vall' to validate on (has train, val)", "set data.val_split", "train.validate: false")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


@pytest.mark.timeout(300)
def test_epoch_and_final_lines_agree_on_k_of_top_k(packed: Path, tmp_path: Path) -> None:
    """4 classes: top-5 would count every sample a hit; both lines say top-4."""
    done = imgpipe_train(write_config(tmp_path, packed, epochs=1), "--gpus", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "top-4" in done.stdout.split("val:")[1].splitlines()[0]
    final = next(line for line in done.stdout.splitlines() if line.startswith("done:"))
    assert "top-4" in final and "top-5" not in done.stdout, done.stdout


@pytest.mark.timeout(240)
def test_fewer_model_classes_than_the_pack_has_is_one_line(packed: Path, tmp_path: Path) -> None:
    done = imgpipe_train(write_config(tmp_path, packed, max_steps=1), "--set", "model.num_classes=2")
    one_line_error(done, "model.num_classes 2 is less than the 4 classes of", "labels 0-3", "set it to at least 4")


@pytest.mark.timeout(240)
def test_models_with_their_own_needs_train_or_say_why_not(packed: Path, tmp_path: Path) -> None:
    """ViT takes only 224 px images; GoogLeNet returns auxiliary outputs in train mode."""
    config = write_config(tmp_path, packed, max_steps=1)
    done = imgpipe_train(config, *SYNTHETIC, "--set", "model.name=vit_b_16")
    one_line_error(done, "model vit_b_16 cannot take data.image_size 32 images", "224 px", "set data.image_size")
    done = imgpipe_train(config, *SYNTHETIC, "--set", "model.name=googlenet", "--set", "data.image_size=64")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 0 epoch(s), 1 steps" in done.stdout


@pytest.mark.timeout(240)
def test_an_out_of_range_seed_is_one_line_and_the_largest_one_trains(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed, max_steps=1)
    one_line_error(
        imgpipe_train(config, *SYNTHETIC, "--set", "train.seed=4294967296"), "--set train.seed=4294967296", "from 0 to 4294967295"
    )
    one_line_error(imgpipe_train(config, *SYNTHETIC, "--set", "train.seed=-1"), "train.seed must be from 0 to 4294967295, got -1")
    done = imgpipe_train(config, *SYNTHETIC, "--set", "train.seed=4294967295")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 0 epoch(s), 1 steps" in done.stdout


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["torch", "synthetic"])
def test_a_split_smaller_than_one_global_batch_names_what_a_trainer_user_can_set(packed: Path, tmp_path: Path, backend: str) -> None:
    """160 train records; the loaders' own advice (remainder='pad') is no config key of the trainer."""
    done = imgpipe_train(write_config(tmp_path, packed, max_steps=1), "--set", f"data.backend={backend}", "--set", "train.batch_size=200")
    line = one_line_error(
        done, "split 'train' has 160 records, fewer than one global batch of 200", "lower train.batch_size to 160 or less"
    )
    assert "remainder" not in line
