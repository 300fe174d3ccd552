"""Every public argument of both loader factories: a mistake is one ConfigError line naming the argument.

Real shards, the real factories (DALI on the CPU); nothing is iterated, the check happens at construction.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from imgpipe.errors import ConfigError
from imgpipe.loaders.options import LoaderOptions, TorchLoaderOptions

SHARED = [  # (argument, bad value, what the message must say)
    ("batch_size", 8.5, "batch_size must be an integer >= 1, got 8.5"),
    ("batch_size", True, "batch_size must be an integer >= 1, got True"),
    ("batch_size", 0, "batch_size must be >= 1, got 0"),
    ("batch_size", "4", "batch_size must be an integer"),
    ("image_size", "224", "image_size must be an integer >= 1, got '224'"),
    ("image_size", -1, "image_size must be >= 1"),
    ("image_size", 224.0, "image_size must be an integer"),
    ("workers", -1, "workers must be >= 0, got -1"),
    ("workers", 2.5, "workers must be an integer >= 0 or None"),
    ("seed", -3, "seed must be >= 0"),
    ("seed", "0", "seed must be an integer"),
    ("rank", "0", "rank must be an integer >= 0 or None"),
    ("rank", -1, "rank must be >= 0"),
    ("world_size", 0, "world_size must be >= 1"),
    ("train", 1, "train must be True or False, got 1"),
    ("train", "yes", "train must be True or False"),
    ("normalize", None, "normalize must be True or False"),
    ("channels_last", 0, "channels_last must be True or False"),
    ("split", 3, "split must be a split name"),
    ("device", 0, "device must be None, 'cpu', 'cuda' or 'cuda:N'"),
    ("device", "tpu", "device 'tpu' is not a torch device"),
    ("device", "meta", "device 'meta': the loaders run on None, 'cpu', 'cuda' or 'cuda:N'"),
    ("on_corrupt", "ignore", "on_corrupt must be one of 'raise', 'skip', got 'ignore'"),
    ("remainder", "keep", "remainder must be one of 'drop', 'pad', got 'keep'"),
    ("remainder", None, "remainder must be one of 'drop', 'pad'"),
    ("shuffle", 1, "shuffle must be True, False or None"),
    ("block_shuffle", 0, "block_shuffle must be >= 1"),
    ("block_shuffle", 4.0, "block_shuffle must be an integer >= 1 or None"),
    ("shuffle_window", 8, "shuffle_window only applies with block_shuffle"),
    ("prefetch_factor", 0, "prefetch_factor must be >= 1"),
    ("prefetch_factor", 1.5, "prefetch_factor must be an integer"),
    ("cache_dir", 3, "cache_dir must be a local folder (a str or path) or None"),
]
TORCH_ONLY = [
    ("sample_transform", "flip", "sample_transform must be a callable"),
    ("persistent_workers", "no", "persistent_workers must be True or False"),
    ("pin_memory", "auto", "pin_memory must be True, False or None"),
    ("multiprocessing_context", "thread", "multiprocessing_context must be one of"),
    ("max_image_size", 0, "max_image_size must be >= 1"),
]
DALI_ONLY = [
    ("prefetch", 0, "prefetch must be >= 1, got 0"),
    ("prefetch", 2.0, "prefetch must be an integer >= 1"),
    ("on_corrupt", "skip", "on_corrupt='skip' needs the torch loader"),
]
NO_GPU = (
    [("device", "cuda", "torch sees no CUDA GPU"), ("device", "cuda:1", "torch sees no CUDA GPU")] if not torch.cuda.is_available() else []
)


def factory(backend: str, request: pytest.FixtureRequest):
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader

        return make_torch_loader
    request.getfixturevalue("require_dali")  # conftest: skip without DALI, fail under make test or when broken
    from imgpipe.loaders.dali import make_dali_loader

    return make_dali_loader


def cases(backend: str) -> list:
    own = TORCH_ONLY if backend == "torch" else DALI_ONLY
    marks = [pytest.mark.dali] if backend == "dali" else []
    return [pytest.param(backend, *case, id=f"{backend}-{case[0]}={case[1]!r}", marks=marks) for case in SHARED + NO_GPU + own]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("backend", "argument", "value", "message"), cases("torch") + cases("dali"))
def test_a_bad_argument_is_one_config_error_naming_it(
    packed_dir: Path, backend: str, argument: str, value: object, message: str, request: pytest.FixtureRequest
) -> None:
    kwargs = {"batch_size": 4, "image_size": 32, "workers": 0, "rank": 0, "world_size": 1, argument: value}
    with pytest.raises(ConfigError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # prefetch, DALI's old name of prefetch_factor
        factory(backend, request)(packed_dir, **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert argument in str(info.value)


@pytest.mark.parametrize(
    ("factory_name", "options"),
    [("imgpipe.loaders.torch.make_torch_loader", TorchLoaderOptions), ("imgpipe.loaders.dali.make_dali_loader", LoaderOptions)],
)
def test_each_factory_argument_is_an_option_with_the_same_default(factory_name: str, options: type) -> None:
    """The factories' documented keyword arguments are the options type's fields, defaults included: declared once, checked once."""
    module, _, name = factory_name.rpartition(".")
    parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    fields = {f.name: "required" if f.default is dataclasses.MISSING else f.default for f in dataclasses.fields(options)}
    own = {p.name: "required" if p.default is p.empty else p.default for p in parameters.values() if p.name not in ("path", "prefetch")}
    assert own == fields
    assert "phase_timer" not in parameters  # the bench's timer hooks in through phase_timer.timing


@pytest.mark.dali
def test_dalis_prefetch_is_a_deprecated_name_of_prefetch_factor(packed_dir: Path, request: pytest.FixtureRequest) -> None:
    make = factory("dali", request)
    kwargs = {"batch_size": 4, "image_size": 32, "workers": 1, "rank": 0, "world_size": 1, "device": None}
    with pytest.warns(DeprecationWarning, match="prefetch is deprecated: call it prefetch_factor"):
        old = make(packed_dir, prefetch=3, **kwargs)
    assert old._spec == make(packed_dir, prefetch_factor=3, **kwargs)._spec and old._spec.prefetch_factor == 3
    with pytest.raises(ConfigError, match="give prefetch_factor alone"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        make(packed_dir, prefetch=3, prefetch_factor=4, **kwargs)


@pytest.mark.parametrize("backend", ["torch", pytest.param("dali", marks=pytest.mark.dali)])
@pytest.mark.parametrize("path", [123, None, b"/data/rec", [], ["a.rec", 5]], ids=["int", "None", "bytes", "empty-list", "list-with-int"])
def test_a_path_of_the_wrong_kind_is_one_config_error(backend: str, path: object, request: pytest.FixtureRequest) -> None:
    with pytest.raises(
        ConfigError, match=r"^path must be a packed folder, a \.rec file, a glob, a list of \.rec files or a ShardSet, got "
    ):
        factory(backend, request)(path, batch_size=4, image_size=32, workers=0, rank=0, world_size=1)


@pytest.mark.parametrize("backend", ["torch", pytest.param("dali", marks=pytest.mark.dali)])
@pytest.mark.parametrize(
    ("epoch", "message"), [("3", "epoch must be an integer >= 0, got '3'"), (2.5, "epoch must be an integer"), (-1, "epoch must be >= 0")]
)
def test_set_epoch_checks_its_argument(packed_dir: Path, backend: str, epoch: object, message: str, request: pytest.FixtureRequest) -> None:
    loader = factory(backend, request)(packed_dir, batch_size=4, image_size=32, workers=0, rank=0, world_size=1)
    with pytest.raises(ConfigError, match=re.escape(message)):
        loader.set_epoch(epoch)


def test_a_loader_state_that_is_not_a_dict_is_one_config_error(packed_dir: Path, request: pytest.FixtureRequest) -> None:
    loader = factory("torch", request)(packed_dir, batch_size=4, image_size=32, workers=0, rank=0, world_size=1)
    with pytest.raises(ConfigError, match="cannot resume: a loader state is the dict loader.state_dict.. returned, got NoneType"):
        loader.load_state_dict(None)


@pytest.mark.parametrize("backend", ["torch", pytest.param("dali", marks=pytest.mark.dali)])
def test_numpy_integers_and_bools_are_accepted(packed_dir: Path, backend: str, request: pytest.FixtureRequest) -> None:
    loader = factory(backend, request)(packed_dir, batch_size=np.int64(4), image_size=np.int32(32), workers=0, seed=np.uint8(1), rank=0,
                                       world_size=1, train=np.bool_(False), normalize=np.bool_(True))  # fmt: skip
    assert loader.batch_size == 4 and type(loader.batch_size) is int


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_bare_cuda_device_resolves_to_the_current_index(packed_dir: Path) -> None:
    from imgpipe.loaders.torch import make_torch_loader

    loader = make_torch_loader(packed_dir, batch_size=4, image_size=32, workers=0, rank=0, world_size=1, device="cuda")
    assert loader.device == torch.device("cuda", torch.cuda.current_device())
    images, _ = next(iter(loader))
    assert images.device == loader.device


@pytest.mark.dali
def test_dalis_prefetch_beside_the_default_prefetch_factor_is_refused_too(packed_dir: Path, request: pytest.FixtureRequest) -> None:
    """prefetch_factor=2 is its default, given all the same: which of the two was meant is not known either."""
    kwargs = {"batch_size": 4, "image_size": 32, "workers": 1, "rank": 0, "world_size": 1, "device": None}
    with pytest.raises(ConfigError, match="give prefetch_factor alone"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        factory("dali", request)(packed_dir, prefetch=3, prefetch_factor=2, **kwargs)
