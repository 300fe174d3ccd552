"""``model.name``: a torchvision classification model, or a timm one as ``timm:NAME``, built for one rank.

timm is optional (``pip install 'imgpipe[timm]'``): it is imported only for a ``timm:`` name, and
a missing timm is one line saying how to install it. :func:`build_model` puts the model on the
rank's device (BlurPool, SyncBatchNorm, channels_last as the config says), checks the sizes it will
be fed and ``train.deterministic`` before the first step, and wraps it in DDP.
"""

from __future__ import annotations

import difflib
import logging
from typing import TYPE_CHECKING, Any

import torch

from imgpipe.errors import ConfigError
from imgpipe.train.blurpool import apply_blurpool
from imgpipe.train.config import TrainConfig
from imgpipe.train.resolution import parse_resolution, val_image_size

if TYPE_CHECKING:
    from imgpipe.train.rank import RankContext

logger = logging.getLogger(__name__)

TIMM_PREFIX = "timm:"
TIMM_INSTALL = "pip install 'imgpipe[timm]'"


def create_model(name: str, num_classes: int) -> torch.nn.Module:
    """The untrained model ``name`` with ``num_classes`` outputs (checked by :func:`check_model_name`)."""
    if name.startswith(TIMM_PREFIX):
        return _timm().create_model(name[len(TIMM_PREFIX) :], pretrained=False, num_classes=num_classes)
    import torchvision

    model = torchvision.models.get_model(name, num_classes=num_classes)
    if getattr(model, "aux_logits", False):  # GoogLeNet, Inception v3: train on the main head; the auxiliary ones would get no loss
        model = torchvision.models.get_model(name, num_classes=num_classes, aux_logits=False)
    return model


def check_model_name(name: str, option: str = "model.name") -> None:
    """A ConfigError naming ``option`` (with the closest names) unless ``name`` is a torchvision
    classification model, or ``timm:NAME`` of a timm model."""
    if name.startswith(TIMM_PREFIX):
        timm, bare = _timm(option, name), name[len(TIMM_PREFIX) :]
        if not timm.is_model(bare):
            close = difflib.get_close_matches(bare, timm.list_models(), n=3)
            raise ConfigError(
                f"{option} {name!r} is not a timm model" + (f"; did you mean {', '.join(TIMM_PREFIX + c for c in close)}?" if close else "")
            )
        return
    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        raise ConfigError(
            f"{option} {name!r} is not a torchvision classification model"
            + (f"; did you mean {', '.join(close)}?" if close else "")
            + f" (a timm model is {TIMM_PREFIX}NAME)"
        )


def trained_min_size(name: str) -> int | None:
    """The smallest input torchvision's weights for ``name`` were made at, where it says; None otherwise."""
    if name.startswith(TIMM_PREFIX):
        return None
    import torchvision

    weights = torchvision.models.get_model_weights(name)
    size = next(iter(weights)).meta.get("min_size") if len(weights) else None
    return size[0] if size else None


def _timm(option: str = "model.name", name: str = "timm:...") -> Any:
    try:
        import timm
    except ImportError:
        raise ConfigError(f"{option} {name!r} needs timm, which is not installed here: {TIMM_INSTALL}") from None
    return timm


def build_model(config: TrainConfig, num_classes: int, ctx: RankContext) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(model, what to call it through): the model (with BlurPool when model.blurpool) on this rank's device, DDP-wrapped when distributed.

    The name is checked by :func:`check_model_name` before the data is built (see ``loop.train_rank``).
    """
    model = create_model(config.model.name, num_classes)
    if config.model.blurpool:
        apply_blurpool(model)
    if config.train.sync_bn and ctx.distributed:
        if ctx.device.type != "cuda":
            raise ConfigError("train.sync_bn needs GPUs (SyncBatchNorm is CUDA-only); set it to false for CPU runs")
        logger.warning(
            "train.sync_bn: every BatchNorm layer now all-reduces its statistics in every step; "
            "expect a slower step (worth it only for small per-rank batches)"
        )
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    memory_format = torch.channels_last if config.train.channels_last else torch.contiguous_format
    model = model.to(ctx.device, memory_format=memory_format)
    check_image_size(model, config, ctx.device)
    check_deterministic(model, config, ctx.device)
    if not ctx.distributed:
        return model, model
    ddp = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        find_unused_parameters=config.train.find_unused_parameters,
    )
    return model, ddp


def check_image_size(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> None:
    """A ConfigError unless ``model`` takes every size the run feeds it (the training sizes of data.resolution,
    else data.image_size, and the validation size): one forward pass of one blank image each, in eval mode.

    Some models only take one size (ViT: 224 px) and fail deep inside their forward otherwise.
    """
    sizes = parse_resolution(config.data.resolution, config.data.image_size).distinct(config.train.epochs)
    key = "data.resolution" if config.data.resolution is not None else "data.image_size"
    checks = [(size, key) for size in sizes]
    if config.train.validate:
        checks.append((val_image_size(config), "data.val_image_size" if config.data.val_image_size else "data.image_size"))
    model.eval()
    try:
        for size, key in dict(checks).items():
            try:
                with torch.no_grad():
                    model(torch.zeros(1, 3, size, size, device=device))
            except (AssertionError, RuntimeError, ValueError) as e:
                trained = trained_min_size(config.model.name)
                hint = f"; its weights were made at {trained} px or more" if trained and trained > size else ""
                first = str(e).splitlines()[0] if str(e) else ""
                raise ConfigError(
                    f"model {config.model.name} cannot take {key} {size} images ({type(e).__name__}: {first}){hint}; "
                    f"set {key} to sizes the model takes"
                ) from None
    finally:
        model.train()


def check_deterministic(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> None:
    """A ConfigError when train.deterministic asks CUDA for a backward pass it has no deterministic kernel for.

    Adaptive pooling to anything but 1x1 (VGG, AlexNet: 7x7; Inception's auxiliary heads) has
    none on CUDA (pooling to 1x1 is a mean, which has); torch would fail in the first backward.
    """
    if not config.train.deterministic or device.type != "cuda":
        return
    pools = (
        torch.nn.AdaptiveAvgPool1d,
        torch.nn.AdaptiveAvgPool2d,
        torch.nn.AdaptiveAvgPool3d,
        torch.nn.AdaptiveMaxPool1d,
        torch.nn.AdaptiveMaxPool2d,
        torch.nn.AdaptiveMaxPool3d,
    )
    for name, module in model.named_modules():
        if isinstance(module, pools):
            size = module.output_size if isinstance(module.output_size, tuple) else (module.output_size,)
            if isinstance(module, pools[3:]) or any(s != 1 for s in size):
                raise ConfigError(
                    f"train.deterministic: true on CUDA, but model {config.model.name} has {type(module).__name__}"
                    f"(output_size={module.output_size}) at {name!r}, whose backward pass CUDA can only run non-deterministically; "
                    "set train.deterministic: false, or choose a model that pools to 1x1 (resnet, efficientnet, ...)"
                )
