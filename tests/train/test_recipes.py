"""The recipes shipped in the package: FFCV's hyperparameters, --recipe under --config under --set, and the wheel carries them."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from imgpipe.errors import ConfigError
from imgpipe.train.config import load_config
from imgpipe.train.recipe import recipe_names

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "imgpipe" / "train" / "recipes"
# FFCV's ffcv-imagenet configs (commit 4dd291a): (epochs, ramp, lr at global batch, global batch, weight decay, arch,
# where lr_peak_epoch 2 comes from: the rn18 configs set it, the rn50 ones leave train_imagenet.py's default)
FFCV = {
    "rn50-16ep": (16, (11, 13), 1.7, 4096, 1e-4, "resnet50", "script default"),
    "rn50-88ep": (88, (65, 76), 1.7, 4096, 1e-4, "resnet50", "script default"),
    "rn18-16ep": (16, (11, 13), 0.5, 1024, 5e-5, "resnet18", "config lr.lr_peak_epoch"),
    "rn18-88ep": (88, (65, 76), 0.5, 1024, 5e-5, "resnet18", "config lr.lr_peak_epoch"),
}


def imgpipe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgpipe", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", sorted(FFCV))
def test_each_recipe_loads_with_ffcvs_hyperparameters(name: str) -> None:
    epochs, (start, end), lr, global_batch, decay, arch, peak_source = FFCV[name]
    config = load_config(recipe=name)
    assert config.model.name == arch and config.model.blurpool
    assert config.data.resolution == {"start_px": 160, "end_px": 192, "start_ramp": start, "end_ramp": end}
    assert (config.data.val_image_size, config.data.val_crop_ratio, config.data.val_flip_tta) == (256, 0.875, True)
    assert config.optim.base_lr * global_batch / 256 == pytest.approx(lr)
    assert (config.optim.schedule, config.optim.lr_peak_epoch, config.optim.warmup_epochs) == ("linear_ramp", 2, 0)
    assert (config.optim.weight_decay, config.optim.bn_weight_decay, config.optim.label_smoothing) == (decay, 0.0, 0.1)
    assert (config.optim.momentum, config.optim.nesterov) == (0.9, False)
    assert (config.train.epochs, config.train.global_batch_size) == (epochs, global_batch)
    text = (RECIPES / f"{name}.yaml").read_text()
    for line in text.splitlines():
        if ":" in line and not line.startswith(("#", "data:", "model:", "optim:", "train:")):
            assert "  # " in line, f"{name}: no source for {line.strip()!r}"  # every value says where it came from
    (peak,) = [line for line in text.splitlines() if line.strip().startswith("lr_peak_epoch:")]
    assert peak.split("  # ")[1].startswith(peak_source), peak


def test_the_recipes_are_the_four_of_the_issue() -> None:
    assert recipe_names() == sorted(FFCV) == sorted(p.stem for p in RECIPES.glob("*.yaml"))


def test_config_overrides_the_recipe_and_set_overrides_both(tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump({"train": {"epochs": 5, "batch_size": 8}, "model": {"name": "resnet34"}}))
    merged = load_config(config, ["train.epochs=3", "data.path=/data"], recipe="rn50-16ep")
    assert merged.train.epochs == 3  # --set over the config over the recipe
    assert merged.model.name == "resnet34" and merged.model.blurpool  # the config's key, the recipe's other keys
    assert merged.train.batch_size == 8 and merged.train.global_batch_size == 4096 and merged.data.path == "/data"
    with pytest.raises(ConfigError) as error:
        load_config(None, ["optim.lr_peak_epoch=20"], recipe="rn50-16ep")
    assert str(error.value).startswith("--set optim.lr_peak_epoch=20: optim.lr_peak_epoch 20 must come before the last epoch")
    with pytest.raises(ConfigError, match=r"^no recipe 'rn99'; the recipes are rn18-16ep, rn18-88ep, rn50-16ep, rn50-88ep"):
        load_config(recipe="rn99")


def test_an_empty_section_of_the_config_keeps_the_recipes_keys(tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text("data:\n  # path: /data\n  # workers: 4\nmodel:\ntrain: {epochs: 5}\n")  # data: and model: are null in YAML
    merged = load_config(config, ["data.workers=2"], recipe="rn50-16ep")
    assert merged.data.image_size == 160 and merged.data.val_image_size == 256 and merged.data.workers == 2
    assert merged.model.name == "resnet50" and merged.model.blurpool and merged.train.epochs == 5
    alone = load_config(config, ["data.path=/data"])  # without a recipe: the defaults, and --set into the empty section
    assert alone.data.path == "/data" and alone.model == load_config().model
    config.write_text("dtaa:\n")
    with pytest.raises(ConfigError, match=r"unknown section 'dtaa'; did you mean 'data'\?"):
        load_config(config, recipe="rn50-16ep")


def test_the_cli_lists_prints_and_refuses_recipes(tmp_path: Path) -> None:
    listed = imgpipe("train", "--list-recipes")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == sorted(FFCV)
    assert "73.8% top-1 in 14.9 min on 8 x A100" in listed.stdout
    config = tmp_path / "mine.yaml"
    config.write_text("train: {epochs: 5}\n")
    shown = imgpipe("train", "--recipe", "rn18-16ep", "--config", str(config), "--set", "train.epochs=4", "--print-config")
    assert shown.returncode == 0, shown.stderr
    printed = yaml.safe_load(shown.stdout)
    assert printed["train"]["epochs"] == 4 and printed["model"]["name"] == "resnet18" and printed["data"]["val_image_size"] == 256
    bad = imgpipe("train", "--recipe", "rn18-16", "--set", "data.path=/x")
    assert bad.returncode == 1 and bad.stderr.strip() == (
        "imgpipe: error: no recipe 'rn18-16'; the recipes are rn18-16ep, rn18-88ep, rn50-16ep, rn50-88ep (imgpipe train --list-recipes)"
    )


def test_the_package_data_globs_ship_every_recipe() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["imgpipe.train"]
    for path in RECIPES.glob("*.yaml"):
        relative = path.relative_to(ROOT / "imgpipe" / "train").as_posix()
        assert any(fnmatch.fnmatch(relative, glob) for glob in package_data), relative


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_built_wheel_holds_the_recipes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("imgpipe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"imgpipe/train/recipes/{name}.yaml" for name in FFCV} <= names
