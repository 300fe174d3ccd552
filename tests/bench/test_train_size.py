"""imgpipe bench measures at the size the trainer config (a recipe) trains at, unless --image-size says otherwise."""

from __future__ import annotations

from pathlib import Path

from imgpipe.bench.runner import BenchConfig


def test_the_size_is_the_recipes_first_training_size_or_the_one_asked(tmp_path: Path) -> None:
    recipe = BenchConfig(data=str(tmp_path), train_recipe="rn50-16ep")
    assert recipe.train_size == 160  # rn50-16ep trains at 160 px until its ramp to 192
    train = recipe.train_config()
    assert (train.data.image_size, train.data.resolution, train.model.blurpool) == (160, None, True)
    assert BenchConfig(data=str(tmp_path), train_recipe="rn50-16ep", image_size=192).train_config().data.image_size == 192
    assert BenchConfig(data=str(tmp_path)).train_size == 224  # no config: the trainer's default
    ramp = BenchConfig(data=str(tmp_path), train_overrides=("data.resolution=[96, 128]",))
    assert ramp.train_size == 96
