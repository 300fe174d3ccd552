"""model.name: torchvision's names, timm's as timm:NAME when timm is installed, and one line when it is not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from imgpipe.errors import ConfigError
from imgpipe.train.models import check_model_name, create_model


def test_a_timm_name_builds_timms_model() -> None:
    timm = pytest.importorskip("timm")
    check_model_name("timm:resnet18")
    model = create_model("timm:resnet18", num_classes=7)
    assert type(model).__module__.startswith("timm.") and model.eval()(torch.zeros(1, 3, 32, 32)).shape == (1, 7)
    assert timm.is_model("resnet18")
    with pytest.raises(ConfigError, match=r"model.name 'timm:resnet5' is not a timm model; did you mean timm:resnet"):
        check_model_name("timm:resnet5")


def test_plain_names_stay_torchvisions() -> None:
    model = create_model("resnet18", num_classes=3)
    assert type(model).__module__ == "torchvision.models.resnet"
    with pytest.raises(
        ConfigError, match=r"'resnet5' is not a torchvision classification model; did you mean .*\(a timm model is timm:NAME\)"
    ):
        check_model_name("resnet5")


def test_without_timm_a_timm_name_is_one_line_saying_how_to_install_it(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["timm"] = None  # as if timm were not installed
        from imgpipe.cli import main
        main(["train", "--set", "model.name=timm:resnet50", "--set", "data.path=/nowhere", "--set", "output.dir={tmp_path / "run"}",
              "--gpus", "0"])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "imgpipe: error: model.name 'timm:resnet50' needs timm, which is not installed here: pip install 'imgpipe[timm]'"
    ), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
