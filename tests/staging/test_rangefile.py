"""RangeFile, where stage and the node cache write, hash and commit a file: ranges land in any order from
several threads, the sha256 is of the bytes on disk, and only a file that hashes right is committed."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from pathlib import Path

import pytest

from imgpipe.staging.rangefile import RangeFile

pytestmark = pytest.mark.timeout(60)


def test_ranges_landing_in_any_order_and_overlapping_hash_the_file_once(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    ranges = [(a, min(a + 100_000, len(data))) for a in range(0, len(data), 100_000)]
    ranges += [(50_000, 250_000), (0, 10)]  # overlaps: the same bytes landed twice (a cache's kept records and a span)
    random.Random(0).shuffle(ranges)
    finished = []
    with RangeFile(tmp_path / "f", len(data)) as file:

        def land(part: list[tuple[int, int]]) -> None:
            for a, b in part:
                file.write(a, data[a:b])
                finished.append(file.landed(a, b))

        threads = [threading.Thread(target=land, args=(ranges[k::4],)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert finished.count(True) == 1 and file.done  # exactly one call hashed the last byte
        assert file.sha256() == hashlib.sha256(data).hexdigest()
        assert file.commit(hashlib.sha256(data).hexdigest())
    assert (tmp_path / "f").read_bytes() == data


def test_the_hash_is_of_the_disk_and_a_wrong_or_unfinished_file_is_never_committed(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    good = hashlib.sha256(data).hexdigest()
    path = tmp_path / "f"
    with RangeFile(path, len(data)) as file:
        file.write(0, data[:1000])
        file.landed(0, 1000)
        with open(path, "r+b") as other:  # bytes changed on the disk behind the writer (a loader's, a power loss's)
            other.seek(2000)
            other.write(b"\xff")
        file.write(1000, data[1000:2000])
        file.write(2001, data[2001:])
        assert not file.commit(good)  # half of it has not landed
        file.landed(1000, len(data))
        assert file.done and file.sha256() != good and not file.commit(good)
    path.write_bytes(data[:10])
    with RangeFile(path, len(data), keep=True) as file:  # keep: bytes already there stay, the size becomes the file's
        assert path.stat().st_size == len(data) and path.read_bytes()[:10] == data[:10]
        file.write(10, data[10:])
        assert file.landed(0, len(data)) and file.commit(good)
    with RangeFile(path, 0) as file:  # not kept: it starts empty; an empty file is done once landed(0, 0)
        assert path.stat().st_size == 0 and file.landed(0, 0) and file.commit(hashlib.sha256(b"").hexdigest())
