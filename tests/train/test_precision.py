"""train.amp and train.channels_last default to auto: bf16 + channels_last on a bf16 GPU, none + NCHW on the CPU; train.compile to false."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from train_cli import SYNTHETIC, imgpipe_train, write_config

from imgpipe.train.config import TrainConfig, default_yaml, load_config
from imgpipe.train.precision import describe, resolve_auto


def test_print_config_says_auto() -> None:
    train = yaml.safe_load(default_yaml())["train"]
    assert (train["amp"], train["channels_last"]) == ("auto", "auto")


def test_auto_is_no_autocast_and_nchw_on_the_cpu() -> None:
    resolved = resolve_auto(TrainConfig(), torch.device("cpu"))
    assert (resolved.train.amp, resolved.train.channels_last) == ("none", False)
    assert describe(resolved) == "amp none, NCHW"
    assert TrainConfig().train.amp == "auto"  # a copy: the caller's config is left as it was


def test_compile_is_off_by_default_and_auto_compiles_only_on_a_cuda_gpu_with_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TrainConfig().train.compile is False and yaml.safe_load(default_yaml())["train"]["compile"] is False
    assert resolve_auto(TrainConfig(), torch.device("cpu")).train.compile is False
    auto = load_config(None, ["train.compile=auto"])
    assert resolve_auto(auto, torch.device("cpu")).train.compile is False
    for capability, compiled in (((8, 0), True), ((7, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, capability=capability: capability)
        assert resolve_auto(auto, torch.device("cuda", 0)).train.compile is compiled
        assert resolve_auto(TrainConfig(), torch.device("cuda", 0)).train.compile is False  # the default stays off on a GPU


@pytest.mark.parametrize(("amp", "channels_last"), [("bf16", True), ("fp16", False), ("none", True), ("bf16", "auto")])
def test_explicit_values_are_kept(amp: str, channels_last: object) -> None:
    config = load_config(None, [f"train.amp={amp}", f"train.channels_last={str(channels_last).lower()}"])
    resolved = resolve_auto(config, torch.device("cpu"))
    assert (resolved.train.amp, resolved.train.channels_last) == (amp, False if channels_last == "auto" else channels_last)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("sets", "ran"),
    [((), ("none", False, "amp none, NCHW")), (("train.amp=bf16", "train.channels_last=true"), ("bf16", True, "amp bf16, channels_last"))],
)
def test_the_saved_config_and_the_epoch_line_say_what_ran(packed: Path, tmp_path: Path, sets: tuple[str, ...], ran: tuple) -> None:
    config = write_config(tmp_path, packed, epochs=1)
    text = yaml.safe_load(config.read_text())
    del text["train"]["log_every"]  # the defaults of everything but the size of the run
    config.write_text(yaml.safe_dump(text))
    done = imgpipe_train(config, "--gpus", "0", *SYNTHETIC, *[arg for item in sets for arg in ("--set", item)])
    assert done.returncode == 0, done.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]
    assert (saved["amp"], saved["channels_last"]) == ran[:2]
    assert f"all ranks; {ran[2]})" in done.stdout
