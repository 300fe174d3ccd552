"""Page-cache residency (mincore) and eviction (posix_fadvise DONTNEED) on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imgpipe._sys.diskinfo import device_for_path
from imgpipe.bench import cache


@pytest.mark.timeout(60)
def test_evict_really_drops_the_file_from_the_page_cache(tmp_path: Path) -> None:
    if device_for_path(tmp_path).fstype in ("tmpfs", "ramfs", "overlay"):
        pytest.skip(f"{tmp_path} is on {device_for_path(tmp_path).fstype}: its pages cannot be evicted")
    path = tmp_path / "shard.rec"
    path.write_bytes(os.urandom(4 << 20))
    path.read_bytes()
    before = cache.resident_fraction([path])
    if before is None:
        pytest.skip("mincore is not available here")
    assert before > 0.9
    assert cache.evict([path]) == 1
    after = cache.resident_fraction([path])
    assert after is not None and after < 0.1
    path.read_bytes()
    assert cache.resident_fraction([path]) > 0.9


def test_residency_counts_pages(tmp_path: Path) -> None:
    empty = tmp_path / "empty.idx"
    empty.write_bytes(b"")
    assert cache.resident_pages(empty) == (0, 0)
    small = tmp_path / "small.idx"
    small.write_bytes(b"x" * (cache.PAGE_SIZE + 1))
    counts = cache.resident_pages(small)
    assert counts is not None and counts[1] == 2
