"""imgpipe: ImageNet-scale image classification data, packed, loaded and trained on, fast and correctly.

The public API is imported lazily so that ``imgpipe pack`` never pays for importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "open_shards": "imgpipe.cache.opening",
    "ShardSet": "imgpipe.format.shardset",
    "make_torch_loader": "imgpipe.loaders.torch",
    "make_dali_loader": "imgpipe.loaders.dali",
    "pack": "imgpipe.packing.packer",
    "verify": "imgpipe.format.verify",
    "stage": "imgpipe.staging.stager",
    "DistEnv": "imgpipe.distenv",
    "ImgpipeError": "imgpipe.errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'imgpipe' has no attribute {name!r}")
    return getattr(import_module(_PUBLIC[name]), name)
