"""imgpipe's own words for DDP's unused-parameter error and for CUDA out-of-memory."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from _hooks.faults import recorded_illegal_memory_access
from train_cli import free_port

from imgpipe.distenv import DistEnv
from imgpipe.errors import TrainError
from imgpipe.train.config import load_config
from imgpipe.train.failures import explain_failure
from imgpipe.train.rank import RankContext


class HalfUsed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(2, 2)
        self.unused = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


@pytest.fixture
def gloo_group(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def cpu_context() -> RankContext:
    return RankContext(DistEnv(), torch.device("cpu"), "gloo", 30.0)


@pytest.mark.timeout(60)
def test_unused_parameters_get_the_hint(gloo_group: None) -> None:
    model = torch.nn.parallel.DistributedDataParallel(HalfUsed())
    with pytest.raises(RuntimeError) as raised:
        for _ in range(3):
            model(torch.randn(4, 2)).sum().backward()
    config = load_config(None, ["model.name=my_net"])
    explained = explain_failure(raised.value, cpu_context(), config)
    assert isinstance(explained, TrainError)
    assert "model 'my_net'" in str(explained) and "train.find_unused_parameters: true" in str(explained)


def test_out_of_memory_names_batch_size_and_advice() -> None:
    config = load_config(None, ["train.batch_size=512", "model.name=resnet152"])
    message = str(explain_failure(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), cpu_context(), config))
    assert "train.batch_size=512 per process" in message and "resnet152" in message
    assert "lower train.batch_size" in message and "train.amp: bf16" in message and "train.grad_accum" in message
    assert "\n" not in message


def test_an_illegal_memory_access_is_a_sticky_kernel_error_not_an_out_of_memory() -> None:
    config = load_config(None, ["train.batch_size=512", "model.name=resnet152"])
    message = str(explain_failure(recorded_illegal_memory_access(), cpu_context(), config))  # torch's own, from a real one on a GPU
    assert "sticky" in message and "out of bounds" in message and "CUDA_LAUNCH_BLOCKING=1" in message
    assert "out of memory" not in message.replace("not an out-of-memory", "") and "lower train.batch_size" not in message
    assert "\n" not in message


def test_other_errors_are_left_alone() -> None:
    assert explain_failure(RuntimeError("shape mismatch"), cpu_context(), load_config()) is None


def test_an_op_without_a_deterministic_kernel_is_one_line_naming_it() -> None:
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError) as raised:  # put_ has no deterministic kernel, on the CPU too
            torch.zeros(4).put_(torch.tensor([0, 1]), torch.tensor([1.0, 2.0]))
    finally:
        torch.use_deterministic_algorithms(previous)
    message = str(explain_failure(raised.value, cpu_context(), load_config(None, ["model.name=vgg11", "train.deterministic=true"])))
    assert "train.deterministic: true" in message and "vgg11" in message and "(put_)" in message and "\n" not in message


@pytest.mark.parametrize(
    ("name", "deterministic", "device", "fails"),
    [
        ("vgg11", True, "cuda", True),  # AdaptiveAvgPool2d((7, 7))
        ("vgg11", True, "cpu", False),
        ("vgg11", False, "cuda", False),
        ("resnet18", True, "cuda", False),  # pools to 1x1: a mean
    ],
)
def test_deterministic_cuda_refuses_adaptive_pooling_to_more_than_1x1_before_training(
    name: str, deterministic: bool, device: str, fails: bool
) -> None:
    """The check build_model runs on every rank's model; here on a CPU-built model, the device only named."""
    import torchvision

    from imgpipe.errors import ConfigError
    from imgpipe.train.models import check_deterministic

    config = load_config(None, [f"model.name={name}", f"train.deterministic={str(deterministic).lower()}"])
    model = torchvision.models.get_model(name, num_classes=4)
    if not fails:
        check_deterministic(model, config, torch.device(device))
        return
    with pytest.raises(ConfigError) as raised:
        check_deterministic(model, config, torch.device(device))
    message = str(raised.value)
    assert "train.deterministic: true on CUDA" in message and "AdaptiveAvgPool2d(output_size=(7, 7))" in message and "'avgpool'" in message
    assert "\n" not in message
