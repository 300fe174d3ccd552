"""Fixtures for the bench tests: the shared ``packed_dir`` (conftest.py one folder up) and a pack of large images."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest


@pytest.fixture(scope="session")
def large_pack(synth_pack: Callable[..., Path]) -> Path:
    """12 large images (1200-1600 px) in 1 shard: decoding dominates."""
    return synth_pack(classes=4, per_class=3, shards=1, min_side=1200, max_side=1600)
