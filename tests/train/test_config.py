"""Training config: YAML -> pydantic models, --set overrides, one-line errors naming the key, schedule and param groups."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from imgpipe.errors import ConfigError
from imgpipe.train.config import TrainConfig, default_yaml, from_dict, load_config, save_config
from imgpipe.train.optim import build_optimizer, lr_schedule


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_defaults_round_trip_through_yaml() -> None:
    assert load_config() == TrainConfig()
    assert from_dict(yaml.safe_load(default_yaml())) == TrainConfig()


def test_file_then_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "data: {path: /d, backend: dali}\ntrain: {batch_size: 32, max_steps: 10}\noptim:\n  schedule: step\n")
    config = load_config(
        path, ["train.max_steps=null", "optim.step_epochs=[1, 2]", "optim.base_lr=1", "train.amp=bf16", "output.resume=true"]
    )
    assert config.data.path == "/d" and config.data.backend == "dali"
    assert config.train.batch_size == 32 and config.train.max_steps is None and config.train.amp == "bf16"
    assert config.optim.step_epochs == [1, 2] and config.optim.base_lr == 1.0 and isinstance(config.optim.base_lr, float)
    assert config.optim.schedule == "step" and config.output.resume is True
    assert load_config(None, ["output.dir=2024", "data.train_split=12"]).output.dir == "2024"  # a number where a name goes: its text


@pytest.mark.parametrize(
    ("text", "resume", "resumes"),
    [
        ("", False, (False, False)),
        ("output: {resume: yes}\n", True, (True, True)),  # YAML 1.1 reads yes as true
        ("output: {resume: true}\n", True, (True, True)),
        ("output: {resume: auto}\n", "auto", (False, True)),
        ("output: {resume: false}\n", False, (False, False)),
    ],
)
def test_output_resume_is_a_boolean_or_auto(tmp_path: Path, text: str, resume: object, resumes: tuple[bool, bool]) -> None:
    output = load_config(write(tmp_path, text)).output
    assert output.resume is resume or output.resume == resume
    assert (output.resumes(checkpoint_exists=False), output.resumes(checkpoint_exists=True)) == resumes


@pytest.mark.parametrize(("word", "value"), [("yes", True), ("no", False)])
def test_the_old_resume_strings_still_load_with_a_warning_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, word: str, value: bool
) -> None:
    """Configs saved before output.resume was a boolean hold the quoted strings 'yes' and 'no'."""
    path = write(tmp_path, f"output: {{resume: '{word}'}}\n")
    with caplog.at_level("WARNING", logger="imgpipe.train.config"):
        assert load_config(path).output.resume is value
    written = str(value).lower()
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: output.resume '{word}' is read as {written}; write {written} (the strings 'yes' and 'no' are deprecated)"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="imgpipe.train.config"):
        assert load_config(path, ["output.resume=true"]).output.resume is True  # --resume over an old file: nothing old is read
    assert caplog.records == []


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("train: {batchsize: 3}\n", [], "unknown key 'train.batchsize'; did you mean 'train.batch_size'?"),
        ("trian: {epochs: 3}\n", [], "unknown section 'trian'; did you mean 'train'?"),
        ("optim: {base_rl: 0.1}\n", [], "unknown key 'optim.base_rl'; did you mean 'optim.base_lr'?"),
        ("", ["train.epochs=many"], "train.epochs must be an integer, got 'many'"),
        ("", ["train.epochs=3.0"], "train.epochs must be an integer, got 3.0"),
        ("", ["train.epochs=true"], "train.epochs must be an integer, got True"),
        ("", ["train.channels_last=1"], "train.channels_last must be true, false or auto, got 1"),
        ("", ["train.channels_last=maybe"], "train.channels_last must be true, false or auto, got 'maybe'"),
        ("", ["output.resume=maybe"], "output.resume must be true, false or auto, got 'maybe'"),
        ("", ["output.resume='true'"], "output.resume must be true, false or auto, got 'true'"),
        ("", ["train.amp=fp8"], "train.amp must be auto, none, bf16 or fp16, got 'fp8'"),
        ("", ["data.backend=jax"], "data.backend must be torch, dali or synthetic, got 'jax'"),
        ("", ["train.batch_size=0"], "train.batch_size must be > 0, got 0"),
        ("", ["train.max_steps=0"], "train.max_steps must be > 0 or null, got 0"),
        ("", ["data.prefetch_factor=0"], "data.prefetch_factor must be > 0, got 0"),
        ("", ["data.workers=-1"], "data.workers must be >= 0 or null, got -1"),
        ("", ["optim.label_smoothing=1.5"], "optim.label_smoothing must be in [0, 1), got 1.5"),
        ("", ["optim.momentum=-0.9"], "optim.momentum must be in [0, 1), got -0.9"),
        ("", ["optim.momentum=7"], "optim.momentum must be in [0, 1), got 7"),
        ("", ["optim.step_epochs=[30, sixty]"], "optim.step_epochs must be a list of integers, got [30, 'sixty']"),
        ("", ["model.num_classes=1"], "model.num_classes must be >= 2 or null, got 1"),
        ("optim: {base_lr: .inf}\n", [], "optim.base_lr must be a finite number, got inf"),
        ("optim: {weight_decay: .nan}\n", [], "optim.weight_decay must be a finite number, got nan"),
        ("", ["optim.base_lr=-.inf"], "optim.base_lr must be a finite number, got -inf"),
        ("train: 3\n", [], "section 'train' must be a mapping of keys"),
        ("1: {epochs: 3}\n", [], "unknown section '1'; valid: data, model, optim, train, output"),
        ("model: {1: resnet18}\n", [], "unknown key 'model.1'; valid: model.name, model.num_classes, model.blurpool"),
    ],
)
def test_mistakes_are_one_line_naming_where_the_key_and_what_it_needs(
    tmp_path: Path, text: str, overrides: list[str], message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_config(path, overrides)
    assert str(error.value) == f"{f'--set {overrides[-1]}' if overrides else path}: {message}"


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("", ["batch_size=3"], "--set 'batch_size=3': expected section.key=value"),
        ("- 1\n- 2\n", [], "cfg.yaml: the top level must be a mapping"),
        ("train: [1\n", [], "cfg.yaml: not valid YAML"),
    ],
)
def test_a_file_or_set_item_that_is_no_config_is_one_line(tmp_path: Path, text: str, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text), overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.batch_size=abc", "--set train.batch_size=abc: train.batch_size must be an integer, got 'abc'"),
        ("train.batch_size=0", "--set train.batch_size=0: train.batch_size must be > 0, got 0"),
        ("train.amp=fp8", "--set train.amp=fp8: train.amp must be auto, none, bf16 or fp16, got 'fp8'"),
        ("trian.epochs=3", "--set trian.epochs=3: unknown section 'trian'; did you mean 'train'?"),
        ("optim.lr=0.1", "--set optim.lr=0.1: unknown key 'optim.lr'; valid: optim.base_lr,"),
        ("optim.base_rl=0.1", "--set optim.base_rl=0.1: unknown key 'optim.base_rl'; did you mean 'optim.base_lr'?"),
    ],
)
def test_a_bad_set_value_blames_the_set_item_not_the_file(tmp_path: Path, override: str, message: str) -> None:
    config = write(tmp_path, "train: {batch_size: 32, epochs: 2}\n")
    with pytest.raises(ConfigError) as error:
        load_config(config, ["train.epochs=3", override])
    assert str(error.value).startswith(message)
    with pytest.raises(ConfigError) as error:  # a bad value in the file still names the file
        load_config(write(tmp_path, "train: {batch_size: abc}\n"), ["train.epochs=3"])
    assert str(error.value) == f"{config}: train.batch_size must be an integer, got 'abc'"


def test_a_bad_recipe_value_blames_the_recipe_and_a_bad_file_value_over_it_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:  # the recipe's lr_peak_epoch 2 after 2 epochs from the file
        load_config(write(tmp_path, "train: {epochs: 2}\n"), recipe="rn18-16ep")
    assert str(error.value) == "recipe rn18-16ep: optim.lr_peak_epoch 2 must come before the last epoch (train.epochs 2)"
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, "model: {blurpool: 1}\n"), recipe="rn18-16ep")
    assert str(error.value) == f"{tmp_path / 'cfg.yaml'}: model.blurpool must be true or false, got 1"


@pytest.mark.parametrize("text", ["0x10", "0755", "1_000", "1.50", "+1", ".5", "12:30", "2024-06-01", "2024-13-45", "1e3"])
def test_a_path_or_name_that_yaml_reads_as_a_number_or_a_date_keeps_its_text(tmp_path: Path, text: str) -> None:
    """YAML 1.1 reads 0755 as 493, 12:30 as 750, 1.50 as 1.5 and 2024-06-01 as a date (2024-13-45 raised ValueError):
    a folder or a name is the text as written, from --set and from a file alike, and --print-config keeps it."""
    keys = ("data.path", "data.train_split", "model.name", "output.dir")
    config = load_config(None, [f"{key}={text}" for key in keys])
    assert {key: getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in keys} == dict.fromkeys(keys, text)
    path = write(tmp_path, f"data: {{path: {text}, train_split: {text}}}\nmodel: {{name: {text}}}\noutput:\n  dir: {text}\n")
    assert load_config(path) == config and load_config(write(tmp_path, config.to_yaml())) == config
    if text not in ("2024-06-01", "2024-13-45", "1e3"):  # a number where a number goes is still that number
        assert load_config(None, [f"train.timeout_s={text}"]).train.timeout_s == yaml.safe_load(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("data: {path: /data}\ntrain: {epochs: 3}\ndata: {workers: 2}\n", "not valid YAML (key 'data' given twice: lines 1 and 3)"),
        ("train:\n  epochs: 3\n  epochs: 30\n", "not valid YAML (key 'epochs' given twice: lines 2 and 3)"),
        ("data: {resolution: " + "[" * 5000 + "]" * 5000 + "}\n", "not valid YAML (nested too deep)"),
        ("train: {epochs: " + "9" * 5000 + "}\n", "not valid YAML (a number of thousands of digits)"),
    ],
)
def test_a_key_twice_deep_nesting_or_a_huge_number_in_a_config_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    """yaml.safe_load kept the last of a key given twice (a whole section lost), and raised RecursionError or ValueError."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == f"{path}: {message}"
    for item in ("data.resolution=" + "[" * 5000 + "]" * 5000, "train.epochs=" + "9" * 5000):
        with pytest.raises(ConfigError, match=rf"^--set {re.escape(item[:20])}"):
            load_config(None, [item])
    merged = load_config(write(tmp_path, "train:\n  <<: {epochs: 3, batch_size: 8}\n  epochs: 5\n"))  # a merged key overridden
    assert (merged.train.epochs, merged.train.batch_size) == (5, 8)


def test_a_config_file_not_in_utf8_is_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "config.yaml"
    binary.write_bytes(b"\xff\xfetrain: {}\n")
    with pytest.raises(ConfigError, match=r"config.yaml: not a text file in UTF-8 \(byte 0\)"):
        load_config(binary)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")


def test_saved_config_loads_back(tmp_path: Path) -> None:
    config = load_config(None, ["train.batch_size=7", "model.name=resnet18"])
    path = save_config(config, tmp_path / "run")
    assert path == tmp_path / "run" / "config.yaml"
    assert load_config(path) == config


def test_cli_print_config_and_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "imgpipe", "train", "--print-config"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert from_dict(yaml.safe_load(done.stdout)) == TrainConfig()
    bad = write(tmp_path, "train: {epocs: 3}\n")
    done = subprocess.run([sys.executable, "-m", "imgpipe", "train", "--config", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == f"imgpipe: error: {bad}: unknown key 'train.epocs'; did you mean 'train.epochs'?"
    cmd = [
        sys.executable,
        "-m",
        "imgpipe",
        "train",
        "--config",
        str(write(tmp_path, "train: {epochs: 3}\n")),
        "--set",
        "train.batch_size=abc",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == "imgpipe: error: --set train.batch_size=abc: train.batch_size must be an integer, got 'abc'"


def test_print_config_is_yaml_that_loads_back_to_the_same_config(tmp_path: Path) -> None:
    items = ["train.epochs=4", "train.compile=auto", "data.path=/data", "data.resolution=[96, 128]"]
    sets = [arg for item in items for arg in ("--set", item)]
    cmd = [sys.executable, "-m", "imgpipe", "train", "--recipe", "rn18-16ep", *sets, "--resume", "--print-config"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = write(tmp_path, done.stdout)
    assert load_config(printed) == load_config(None, [*items, "output.resume=true"], recipe="rn18-16ep")
    assert "  resume: true\n" in done.stdout and "  compile: auto\n" in done.stdout  # booleans and words, not quoted strings
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(printed), "--print-config"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == done.stdout


def test_warmup_then_cosine_to_zero() -> None:
    config = load_config(None, ["train.epochs=10", "optim.warmup_epochs=2"])
    factor = lr_schedule(config, steps_per_epoch=10)
    assert [round(factor(s), 3) for s in (0, 9, 19)] == [0.05, 0.5, 1.0]
    assert factor(20) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.5)
    assert factor(99) < 0.001 and factor(100) == pytest.approx(0.0)


def test_step_decay() -> None:
    config = load_config(
        None, ["train.epochs=10", "optim.warmup_epochs=0", "optim.schedule=step", "optim.step_epochs=[3, 6]", "optim.step_gamma=0.5"]
    )
    factor = lr_schedule(config, steps_per_epoch=4)
    assert [factor(s) for s in (0, 11, 12, 23, 24, 39)] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]


def test_lr_scaled_by_global_batch_and_no_decay_on_bn_and_bias() -> None:
    import torchvision

    model = torchvision.models.get_model("resnet18", num_classes=4)
    config = load_config(None, ["optim.base_lr=0.1", "optim.weight_decay=0.0005"])
    optimizer = build_optimizer(model, config, global_batch=1024)
    decay, no_decay = optimizer.param_groups
    assert decay["lr"] == pytest.approx(0.4) and decay["weight_decay"] == 0.0005 and no_decay["weight_decay"] == 0.0
    bn_and_bias = {
        id(p)
        for m in model.modules()
        if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.Linear))
        for n, p in m.named_parameters()
        if isinstance(m, torch.nn.BatchNorm2d) or n == "bias"
    }
    assert {id(p) for p in no_decay["params"]} == bn_and_bias
    assert all(p.ndim == 4 or p.ndim == 2 for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_linear_ramp_is_ffcvs_cyclic_schedule() -> None:
    """FFCV's get_cyclic_lr: np.interp(epoch, [0, lr_peak_epoch, epochs], [1e-4, 1, 0]) x lr, stepped through each epoch."""
    config = load_config(None, ["train.epochs=16", "optim.schedule=linear_ramp", "optim.lr_peak_epoch=2", "optim.warmup_epochs=0"])
    factor = lr_schedule(config, steps_per_epoch=10)
    assert factor(0) == pytest.approx(1e-4)
    assert factor(10) == pytest.approx(0.5 + 0.5e-4)  # epoch 1: half way up
    assert factor(20) == pytest.approx(1.0)  # the peak
    assert factor(25) == pytest.approx(1 - 5 / 140)
    assert factor(90) == pytest.approx(0.5)  # epoch 9: half way down
    assert factor(160) == pytest.approx(0.0)
    assert all(factor(s) < factor(s + 1) for s in range(20)) and all(factor(s) > factor(s + 1) for s in range(20, 160))


def test_linear_ramp_alone_has_no_warmup_and_a_warmup_set_with_it_is_refused_in_one_line(tmp_path: Path) -> None:
    ramp = load_config(None, ["optim.schedule=linear_ramp", "train.epochs=16"])
    assert ramp.optim.warmup_epochs is None and ramp.optim.warmup == 0.0
    assert lr_schedule(ramp, steps_per_epoch=10)(0) == pytest.approx(1e-4)  # FFCV's start, no warm-up before it
    assert load_config(None, ["optim.schedule=linear_ramp", "optim.warmup_epochs=0"]).optim.warmup == 0.0
    assert load_config().optim.warmup == 5.0 and load_config(None, ["optim.schedule=step"]).optim.warmup == 5.0
    assert yaml.safe_load(default_yaml())["optim"]["warmup_epochs"] is None
    with pytest.raises(ConfigError) as error:
        load_config(None, ["optim.schedule=linear_ramp", "optim.warmup_epochs=2"])
    assert str(error.value) == (
        "--set optim.warmup_epochs=2: optim.warmup_epochs 2 with optim.schedule linear_ramp, which ramps up to "
        "optim.lr_peak_epoch by itself: unset optim.warmup_epochs, or choose schedule cosine or step"
    )
    with pytest.raises(ConfigError, match=r"^.*cfg.yaml: optim.warmup_epochs 0.5 with optim.schedule linear_ramp"):
        load_config(write(tmp_path, "optim: {warmup_epochs: 0.5}\n"), ["optim.schedule=linear_ramp"])


def test_bn_weight_decay_is_the_decay_of_bn_and_bias_parameters() -> None:
    import torchvision

    model = torchvision.models.get_model("resnet18", num_classes=4)
    optimizer = build_optimizer(model, load_config(None, ["optim.weight_decay=0.0005", "optim.bn_weight_decay=0.0001"]), global_batch=256)
    decay, bn = optimizer.param_groups
    assert decay["weight_decay"] == 0.0005 and bn["weight_decay"] == 0.0001
    assert {id(p) for p in bn["params"]} == {id(p) for p in model.parameters() if p.ndim == 1}
    # a resume re-applies the config's optim section to the loaded optimizer: bn_weight_decay too
    from imgpipe.train.optim import apply_optim_config

    resumed = load_config(None, ["optim.weight_decay=0.0005", "optim.bn_weight_decay=0.0002"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(resumed, steps_per_epoch=10))
    apply_optim_config(optimizer, scheduler, resumed, 256, lr_schedule(resumed, steps_per_epoch=10), step=3)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0005, 0.0002]


def test_a_resolution_ramp_rounds_to_32_px_inside_as_ffcv_does() -> None:
    from imgpipe.train.resolution import parse_resolution

    ramp = parse_resolution({"start_px": 160, "end_px": 256, "start_ramp": 2, "end_ramp": 6}, 224)
    # epochs 3, 4, 5: 184 -> 192, 208 (6.5 x 32, half to even) -> 192, 232 -> 224; the ends stay as given
    assert [ramp.at(e) for e in range(8)] == [160, 160, 160, 192, 192, 224, 256, 256]
    assert ramp.distinct(8) == [160, 192, 224, 256]
    ffcv = parse_resolution({"start_px": 160, "end_px": 192, "start_ramp": 11, "end_ramp": 13}, 224)
    assert [ffcv.at(e) for e in (0, 11, 12, 13, 15)] == [160, 160, 192, 192, 192]  # 176 rounds half to even, as np.round: 192
    listed = parse_resolution([64, 96], 224)
    assert [listed.at(e) for e in range(4)] == [64, 96, 96, 96]
    assert parse_resolution(None, 128).distinct(5) == [128]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.resolution=7", "data.resolution must be a mapping {start_px, end_px, start_ramp, end_ramp} (epochs) or a list of sizes"),
        ("data.resolution={start_px: 160, end_px: 192, start_ramp: 1}", "data.resolution needs end_ramp too"),
        ("data.resolution={start_px: 160, end_px: 192, start_ramp: 1, endramp: 3}", "has no key 'endramp'; did you mean 'end_ramp'?"),
        ("data.resolution={start_px: 192, end_px: 160, start_ramp: 1, end_ramp: 3}", "start_px 192 must not exceed end_px 160"),
        ("data.resolution={start_px: 160, end_px: 192, start_ramp: 4, end_ramp: 3}", "start_ramp 4 must not come after end_ramp 3"),
        ("data.resolution={start_px: 160.5, end_px: 192, start_ramp: 1, end_ramp: 3}", "data.resolution.start_px must be a size in pixels"),
        ("data.resolution=[160, -1]", "data.resolution as a list must hold sizes in pixels"),
        ("data.val_image_size=0", "data.val_image_size must be > 0 or null, got 0"),
        ("data.val_crop_ratio=1.2", "data.val_crop_ratio must be in (0, 1] (such as 224/256 = 0.875), got 1.2"),
        ("data.val_flip_tta=maybe", "data.val_flip_tta must be true or false, got 'maybe'"),
        ("optim.bn_weight_decay=-1", "optim.bn_weight_decay must be >= 0, got -1"),
        ("optim.lr_peak_epoch=-2", "optim.lr_peak_epoch must be >= 0, got -2"),
        ("model.blurpool=1", "model.blurpool must be true or false, got 1"),
        ("train.ema=yes please", "train.ema must be true or false, got 'yes please'"),
        ("train.ema_decay=1.0", "train.ema_decay must be in (0, 1) (such as 0.9998), got 1.0"),
        ("train.mixup_alpha=-0.2", "train.mixup_alpha must be >= 0, got -0.2"),
        ("train.cutmix_alpha=lots", "train.cutmix_alpha must be a number, got 'lots'"),
        ("train.compile=sometimes", "train.compile must be true, false or auto, got 'sometimes'"),
        ("train.target_top1=73.8", "train.target_top1 must be in (0, 1] or null (a top-1 accuracy such as 0.738), got 73.8"),
    ],
)
def test_the_time_to_accuracy_keys_refuse_bad_values_in_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    assert str(error.value).startswith(f"--set {override}: ") and message in str(error.value), str(error.value)
    assert "\n" not in str(error.value)


def test_a_target_top1_without_validation_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"^--set train.target_top1=0.7: train.target_top1 is checked against the validation: set train.validate: true"
    ):
        load_config(None, ["train.validate=false", "train.target_top1=0.7"])


def test_linear_ramp_needs_its_peak_before_the_last_epoch() -> None:
    with pytest.raises(ConfigError, match=r"optim.lr_peak_epoch 4 must come before the last epoch \(train.epochs 4\)"):
        load_config(None, ["optim.schedule=linear_ramp", "optim.warmup_epochs=0", "train.epochs=4", "optim.lr_peak_epoch=4"])


def test_data_prefetch_factor_reaches_the_trainers_and_the_benchs_torch_loaders(packed_dir: Path) -> None:
    """From a URL each worker then fetches the records of data.prefetch_factor - 1 batches ahead (tests/remote)."""
    from imgpipe.bench.probes import make_loader
    from imgpipe.distenv import DistEnv
    from imgpipe.train.data import build_data
    from imgpipe.train.precision import resolve_auto
    from imgpipe.train.rank import RankContext

    ctx = RankContext(DistEnv(), torch.device("cpu"), None, 30.0)
    config = resolve_auto(
        load_config(None, [f"data.path={packed_dir}", "data.prefetch_factor=3", "data.workers=0", "train.batch_size=4"]), ctx.device
    )
    data = build_data(config, ctx)
    bench = make_loader("torch", config, ctx, None)
    try:
        assert data.train.options.prefetch_factor == data.val.options.prefetch_factor == bench.options.prefetch_factor == 3
    finally:
        for loader in (data.train, data.val, bench):
            loader.close()
