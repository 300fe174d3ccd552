"""Shared fixtures: a small synthetic ImageNet tree and that tree packed, made once per session.

Treat both as read-only: copy them (``shutil.copytree``) before changing anything.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SYNTH_CLASSES = 4
SYNTH_PER_CLASS = 12
SYNTH_VAL_PER_CLASS = 3


@pytest.fixture(scope="session")
def synth_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``train/<wnid>/*.JPEG`` (4 classes x 12), flat ``val/`` (3 per class) + ``LOC_val_solution.csv``; 64-160 px."""
    from imgpipe.synth import make_synthetic

    root = tmp_path_factory.mktemp("synth") / "imagenet"
    make_synthetic(
        root, classes=SYNTH_CLASSES, per_class=SYNTH_PER_CLASS, val_per_class=SYNTH_VAL_PER_CLASS, seed=0, min_side=64, max_side=160,
        progress=False,
    )
    return root


@pytest.fixture(scope="session")
def packed_dir(synth_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``synth_tree`` packed into 2 train shards + 1 val shard (no resize, shuffled with seed 0)."""
    from imgpipe.packer import pack

    dst = tmp_path_factory.mktemp("packed") / "packed"
    pack(synth_tree, dst, shards="train=2,val=1", workers=1, progress=False)
    return dst


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    """The MXNet 1.9.1 reference interpreter (``make test`` builds it); the test is skipped without it."""
    python = os.environ.get("IMGPIPE_MXNET_PYTHON", "")
    if not python or not os.access(python, os.X_OK):
        pytest.skip("IMGPIPE_MXNET_PYTHON is not set to the MXNet venv's python (make test builds it)")
    return python


@pytest.fixture(scope="session")
def im2rec_script(mxnet_python: str) -> str:
    """MXNet's own ``tools/im2rec.py``, from the reference venv."""
    code = "import mxnet, os; print(os.path.join(os.path.dirname(mxnet.__file__), 'tools', 'im2rec.py'))"
    return subprocess.run([mxnet_python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
