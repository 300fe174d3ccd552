"""The loaders' default device: the current CUDA device when there is one, else the CPU; None is the CPU."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from imgpipe.loaders.options import CURRENT_DEVICE, default_device, resolve_device


def never_called() -> int:
    raise AssertionError("the current CUDA index is read only when CUDA is available")


def test_the_default_is_the_current_cuda_device_when_cuda_is_available() -> None:
    assert default_device(True, lambda: 3) == "cuda:3"
    assert default_device(True, lambda: 0) == "cuda:0"


def test_the_default_is_the_cpu_without_cuda() -> None:
    assert default_device(False, never_called) == "cpu"


def test_none_still_means_the_cpu() -> None:
    assert resolve_device(None) == torch.device("cpu")


@pytest.mark.parametrize(("cuda", "expected"), [(True, torch.device("cuda", 1)), (False, torch.device("cpu"))])
def test_the_default_resolves_to_what_torch_sees(monkeypatch: pytest.MonkeyPatch, cuda: bool, expected: torch.device) -> None:
    """torch seeing two GPUs with cuda:1 current, or none: the default is cuda:1, or the CPU (whatever this machine has)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if cuda else 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1 if cuda else never_called())
    assert resolve_device(CURRENT_DEVICE) == expected
    assert resolve_device(None) == torch.device("cpu")


@pytest.mark.parametrize("backend", ["torch", pytest.param("dali", marks=pytest.mark.dali)])
def test_both_factories_default_to_the_current_device(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader as make
    else:
        request.getfixturevalue("require_dali")
        from imgpipe.loaders.dali import make_dali_loader as make
    assert inspect.signature(make).parameters["device"].default is CURRENT_DEVICE


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["torch", pytest.param("dali", marks=pytest.mark.dali)])
def test_a_loader_built_without_a_device_uses_the_default(packed_dir: Path, backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader as make
    else:
        request.getfixturevalue("require_dali")
        from imgpipe.loaders.dali import make_dali_loader as make
    loader = make(packed_dir, batch_size=4, image_size=32, workers=0 if backend == "torch" else 1, rank=0, world_size=1)
    images, _ = next(iter(loader))
    assert images.device == (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    loader.close()
