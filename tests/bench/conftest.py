"""Fixtures for the bench tests: real packed folders, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import make_pack


@pytest.fixture(scope="session")
def small_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 small images (64-160 px) in 2 shards."""
    return make_pack(tmp_path_factory.mktemp("bench-small"), records=48)


@pytest.fixture(scope="session")
def large_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 large noisy images (1200-1600 px): decoding dominates."""
    return make_pack(tmp_path_factory.mktemp("bench-large"), records=12, side=(1200, 1600), shards=1)
