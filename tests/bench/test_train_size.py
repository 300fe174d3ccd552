"""imgpipe bench measures at the size the trainer config (a recipe) trains at, unless --image-size says otherwise,
and runs the model of the recipe as --config and --set change it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _cli import assert_one_line_error

from imgpipe.bench.config import BenchConfig


def test_the_size_is_the_recipes_first_training_size_or_the_one_asked(tmp_path: Path) -> None:
    recipe = BenchConfig(data=str(tmp_path), train_recipe="rn50-16ep")
    assert recipe.train_size == 160  # rn50-16ep trains at 160 px until its ramp to 192
    train = recipe.train_config()
    assert (train.data.image_size, train.data.resolution, train.model.blurpool) == (160, None, True)
    assert BenchConfig(data=str(tmp_path), train_recipe="rn50-16ep", image_size=192).train_config().data.image_size == 192
    assert BenchConfig(data=str(tmp_path)).train_size == 224  # no config: the trainer's default
    ramp = BenchConfig(data=str(tmp_path), train_overrides=("data.resolution=[96, 128]",))
    assert ramp.train_size == 96


def test_the_model_of_a_recipe_is_the_trainers_recipe_then_config_then_set(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("model: {name: resnet34}\n")
    over = BenchConfig(data=str(tmp_path), train_recipe="rn18-16ep", train_config_path=str(mine)).with_trainer_model()
    assert over.model == "resnet34" and over.train_config().model.blurpool  # the config's name, the recipe's BlurPool
    assert over.train_size == 160
    both = BenchConfig(data=str(tmp_path), train_recipe="rn18-16ep", train_config_path=str(mine), train_overrides=("model.name=resnet50",))
    assert both.with_trainer_model().model == "resnet50"
    assert BenchConfig(data=str(tmp_path), train_recipe="rn18-16ep").with_trainer_model().model == "resnet18"
    assert BenchConfig(data=str(tmp_path), train_recipe="rn18-16ep", model="alexnet").with_trainer_model().model == "alexnet"
    assert BenchConfig(data=str(tmp_path), train_recipe="rn18-16ep", compute_ms=5.0).with_trainer_model().model is None
    assert BenchConfig(data=str(tmp_path), train_config_path=str(mine)).with_trainer_model().model is None  # no recipe: --model or none


def test_the_cli_builds_the_recipes_model_as_the_config_changes_it(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("model: {name: resnet1800}\n")
    done = subprocess.run(
        [sys.executable, "-m", "imgpipe", "bench", str(tmp_path), "--gpus", "0", "--recipe", "rn18-16ep", "--config", str(mine)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(done, "--model 'resnet1800' is not a torchvision classification model")
