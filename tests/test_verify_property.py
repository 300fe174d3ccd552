"""Property: any single damage to a packed folder's .rec, .idx or sidecar files, anywhere, is found by
verify (with worker processes) and named by file, and by record where the damage lies in one record."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgpipe.format.manifest import load_manifest
from imgpipe.format.recordio import FRAME_HEADER, read_index
from imgpipe.format.verify import verify

SIDECARS = [f"{split}.{kind}" for split in ("train", "val") for kind in ("sources.txt", "labels.npy", "crc32.npy")]


@pytest.fixture(scope="module")
def folder(packed_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, int]]:
    """A working copy, the pristine original, and the split-wide number of each shard's first record."""
    work = tmp_path_factory.mktemp("property") / "packed"
    shutil.copytree(packed_dir, work)
    first: dict[str, int] = {}
    for split in load_manifest(packed_dir).splits.values():
        count = 0
        for shard in split.shards:
            first[shard.name] = count
            count += shard.records
    return work, packed_dir, first


damage = st.one_of(
    st.tuples(st.just("flip"), st.sampled_from(["rec", "idx", "sidecar"]), st.integers(0, 2**31), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.sampled_from(["rec", "idx", "sidecar"]), st.integers(0, 2**31), st.just(0)),
    st.tuples(st.just("edit-idx"), st.sampled_from(["offset", "key"]), st.integers(0, 2**31), st.integers(-9, 9).filter(bool)),
)


@pytest.mark.timeout(180)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=damage, shard=st.integers(0, 2))
def test_any_damage_is_found_and_located(folder: tuple[Path, Path, dict[str, int]], damage: tuple, shard: int) -> None:
    work, pristine, first = folder
    kind, target, where, detail = damage
    rec = sorted(first)[shard]  # train-00000-of-00002.rec, train-00001-of-00002.rec, val-00000-of-00001.rec
    name = {"rec": rec, "idx": rec[:-4] + ".idx", "sidecar": SIDECARS[where % len(SIDECARS)]}.get(target, rec[:-4] + ".idx")
    path = work / name
    data = bytearray(path.read_bytes())
    expected_record = None
    if kind == "flip":
        offset = where % len(data)
        data[offset] ^= 1 << detail
        if target == "rec":
            _, starts = read_index(pristine / (name[:-4] + ".idx"))
            k = max(i for i, s in enumerate(starts.tolist()) if s <= offset)
            length = int.from_bytes(data[starts[k] + 4 : starts[k] + 8], "little") & ((1 << 29) - 1)
            if starts[k] + FRAME_HEADER.size <= offset < starts[k] + FRAME_HEADER.size + length:  # inside the record, not its frame
                expected_record = first[rec] + k
    elif kind == "truncate":
        del data[where % len(data) :]
    else:
        lines = data.decode().splitlines(keepends=True)
        k = where % len(lines)
        key, offset = lines[k].rstrip("\n").split("\t")
        key, offset = (int(key) + detail, int(offset)) if target == "key" else (int(key), max(0, int(offset) + detail))
        lines[k] = f"{key}\t{offset}\n"
        data = bytearray("".join(lines).encode())
        expected_record = first[rec] + k
    path.write_bytes(bytes(data))
    try:
        if path.read_bytes() == (pristine / name).read_bytes():  # an edit that changed nothing (offset clamped at 0)
            return
        report = verify(work, workers=2, progress=False)
        assert not report.ok
        named = [p for p in report.problems if p.file == name]
        assert named, (kind, name, [str(p) for p in report.problems])
        if expected_record is not None:
            assert any(p.record == expected_record for p in named), (kind, name, expected_record, [str(p) for p in named])
    finally:
        shutil.copy(pristine / name, path)
