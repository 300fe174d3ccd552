"""Fixtures of the training tests: a learnable packed dataset, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A learnable synthetic ImageNet (4 classes, 40 train + 10 val images each), packed in 2 shards per split."""
    from imgpipe.packing.packer import pack
    from imgpipe.synth.tree import make_synthetic

    root = tmp_path_factory.mktemp("train-data")
    make_synthetic(root / "src", classes=4, per_class=40, val_per_class=10, min_side=64, max_side=128, progress=False)
    pack(root / "src", root / "packed", shards=2, workers=1, progress=False)
    return root / "packed"
