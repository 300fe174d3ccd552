"""The bench's model is the trainer's model: built by the trainer's functions from the same config."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from imgpipe.bench.compute import Compute  # noqa: E402
from imgpipe.bench.config import BenchConfig  # noqa: E402
from imgpipe.bench.probes import make_loader  # noqa: E402
from imgpipe.errors import ConfigError  # noqa: E402
from imgpipe.train.launch import launch  # noqa: E402
from imgpipe.train.models import build_model  # noqa: E402
from imgpipe.train.precision import amp_setup  # noqa: E402
from imgpipe.train.rank import RankContext  # noqa: E402

CHANNELS_LAST = torch.channels_last


def cpu_rank() -> RankContext:
    """The context the launcher gives a single CPU rank (it runs in this process)."""
    return launch(lambda ctx, _: ctx, None, gpus=0)


def memory_formats(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...], bool]]:
    return [(name, tuple(p.shape), p.is_contiguous(memory_format=CHANNELS_LAST)) for name, p in model.named_parameters() if p.ndim == 4]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("overrides", [(), ("train.channels_last=true", "train.amp=bf16")])
def test_model_precision_and_input_memory_format_follow_the_trainer_config(packed_dir: Path, overrides: tuple[str, ...]) -> None:
    config = BenchConfig(data=str(packed_dir), model="resnet18", batch_size=4, image_size=32, train_overrides=overrides)
    ctx = cpu_rank()
    train = config.train_config(0, ctx.device)  # resolved as the trainer resolves it
    compute = Compute(config, ctx, classes=4)
    trainers, _ = build_model(train, 4, ctx)
    assert type(compute.model) is type(trainers)
    assert memory_formats(compute.model) == memory_formats(trainers)
    assert compute.dtype == amp_setup(train, ctx.device)[0]
    if overrides:  # the options reach the model: channels_last weights, a bf16 forward pass
        assert all(is_cl for _, _, is_cl in memory_formats(compute.model)) and compute.dtype is torch.bfloat16

    loader = make_loader("torch", train, ctx, None)
    images, labels = next(iter(loader))
    loader.close()
    assert images.is_contiguous(memory_format=CHANNELS_LAST if train.train.channels_last else torch.contiguous_format)

    outputs: list[torch.dtype] = []
    compute.model.fc.register_forward_hook(lambda _m, _i, out: outputs.append(out.dtype))
    before = compute.model.fc.weight.detach().clone()
    compute.step(images, labels)
    compute.update()
    assert outputs == [compute.dtype or torch.float32]
    assert not torch.equal(before, compute.model.fc.weight)  # the optimizer stepped


@pytest.mark.dali
@pytest.mark.timeout(180)
def test_dali_batches_arrive_in_the_torch_loaders_memory_format(packed_dir: Path) -> None:
    from imgpipe.loaders.dali import dali_available

    if not dali_available():
        pytest.skip("nvidia.dali is not importable (pip install 'imgpipe[dali]')")
    train = BenchConfig(data=str(packed_dir), batch_size=4, image_size=32, train_overrides=("train.channels_last=true",)).train_config(1)
    for backend in ("torch", "dali"):
        loader = make_loader(backend, train, cpu_rank(), None)
        images, _ = next(iter(loader))
        assert images.dtype == torch.float32 and images.is_contiguous(memory_format=CHANNELS_LAST), backend
        getattr(loader, "close", lambda: None)()


def test_a_bad_trainer_option_is_a_config_error(packed_dir: Path) -> None:
    with pytest.raises(ConfigError, match="train.amp"):
        BenchConfig(data=str(packed_dir), train_overrides=("train.amp=fp8",)).check()
