"""``model.name``: a torchvision classification model, or a timm one as ``timm:NAME``.

timm is optional (``pip install 'imgpipe[timm]'``): it is imported only for a ``timm:`` name, and
a missing timm is one line saying how to install it.
"""

from __future__ import annotations

import difflib
from typing import Any

import torch

from imgpipe.errors import ConfigError

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
