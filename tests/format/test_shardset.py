"""ShardSet over packed folders and bare .rec/.idx files: index, labels, reads, errors, fork/pickle, DALI index."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _packs import INDEXED_RECORDS, im2rec_labels, with_payloads, without_index_sidecar  # noqa: E402

from imgpipe.errors import DatasetError, RecordIOError  # noqa: E402
from imgpipe.format.files import index_bytes, parse_index_sidecar  # noqa: E402
from imgpipe.format.manifest import ShardInfo, SplitInfo  # noqa: E402
from imgpipe.format.recordio import MAGIC_BYTES, read_index, read_record_at, unpack_header  # noqa: E402
from imgpipe.format.shardset import open_shardset, sidecar_index  # noqa: E402
from imgpipe.loaders.dali_index import write_dali_index  # noqa: E402


@pytest.fixture
def pack(indexed: Path, tmp_path: Path) -> Path:
    """A private copy of ``indexed`` (37 records in 3 shards, label = record index), to change."""
    return Path(shutil.copytree(indexed, tmp_path / "pack"))


def test_packed_folder_from_the_real_packer(packed_dir: Path) -> None:
    train, val = open_shardset(packed_dir), open_shardset(packed_dir, "val")
    assert (len(train), len(val)) == (48, 12)
    assert train.classes == val.classes == sorted(train.classes) and len(train.classes) == 4
    assert train.labels.dtype == np.int64 and np.bincount(train.labels).tolist() == [12] * 4
    sources = (packed_dir / "train.sources.txt").read_text().splitlines()
    for i in range(len(train)):
        header, payload = train.read(i)
        assert int(header.label) == train.labels[i] and header.id == train.keys[i]
        assert payload[:2] == b"\xff\xd8"
        assert train.source(i) == sources[i]
    assert train.classes[train.labels[5]] in train.source(5)


def test_index_arrays_match_the_idx_files(indexed: Path) -> None:
    s = open_shardset(indexed)
    assert len(s) == INDEXED_RECORDS and s.labels.tolist() == s.keys.tolist() == list(range(INDEXED_RECORDS))
    starts = 0
    for number, rec in enumerate(s.rec_paths):
        keys, offsets = read_index(rec.with_suffix(".idx"))
        for j, offset in enumerate(offsets.tolist()):
            shard, start, end = s.location(starts + j)
            assert (shard, start) == (number, offset)
            with open(rec, "rb") as f:
                _, after = read_record_at(f, start, rec.stat().st_size, rec)
            assert end == after  # the record spans exactly [offset, next offset or file end)
        starts += len(keys)
    assert s.describe(7).startswith(f"{s.rec_paths[s.location(7)[0]].name} record 7 (id 7, offset {s.location(7)[1]}")
    assert s.describe(7).endswith(f"source {(indexed / 'train.sources.txt').read_text().splitlines()[7]})")


def test_the_index_sidecar_is_the_idx_files_and_opens_the_same_split(packed_dir: Path, tmp_path: Path) -> None:
    with_sidecar, without = tmp_path / "with", tmp_path / "without"
    shutil.copytree(packed_dir, with_sidecar)
    shutil.copytree(packed_dir, without)
    without_index_sidecar(without)
    for split in ("train", "val"):
        keys, offsets = parse_index_sidecar((packed_dir / f"{split}.index.npy").read_bytes(), len(open_shardset(without, split)))
        idx = [read_index(p) for p in sorted(packed_dir.glob(f"{split}-*.idx"))]
        assert keys.tolist() == np.concatenate([k for k, _ in idx]).tolist()
        assert offsets.tolist() == np.concatenate([o for _, o in idx]).tolist()
    for p in with_sidecar.glob("*.idx"):
        p.unlink()  # opened from the sidecar, a split needs none of them
    for split in ("train", "val"):
        a, b = open_shardset(with_sidecar, split), open_shardset(without, split)
        assert [a.location(i) for i in range(len(a))] == [b.location(i) for i in range(len(b))]
        assert a.keys.tolist() == b.keys.tolist() and a.labels.tolist() == b.labels.tolist()
        assert all(a.read(i) == b.read(i) for i in range(len(a)))


def test_an_index_sidecar_out_of_file_order_gives_each_record_its_own_end() -> None:
    """Records listed out of file order within a shard (an index imgpipe does not write) still end where the next one in the file starts."""
    info = SplitInfo([ShardInfo("a.rec", "a.idx", 3, 30, "", 0, ""), ShardInfo("b.rec", "b.idx", 2, 8, "", 0, "")], "", "", "", "")
    shard, offsets, ends, keys = sidecar_index(index_bytes(np.arange(5), np.array([20, 0, 10, 0, 5])), info, [30, 8], "x")
    assert shard.tolist() == [0, 0, 0, 1, 1] and keys.tolist() == [0, 1, 2, 3, 4]
    assert offsets.tolist() == [20, 0, 10, 0, 5] and ends.tolist() == [30, 10, 20, 5, 8]


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda d: (d / "train.index.npy").unlink(), "train.index.npy: index sidecar is missing"),
        (lambda d: (d / "train.index.npy").write_bytes(b"\x93NUMPY garbage"), "train.index.npy: not a readable .npy file"),
        (
            lambda d: (d / "train.index.npy").write_bytes(index_bytes(np.arange(3), np.arange(3))),
            r"holds a \(2, 3\) array, expected \(2, 48\)",
        ),
        (
            lambda d: (d / "train.index.npy").write_bytes(index_bytes(np.arange(48), np.arange(48) * 10**8)),
            "record 1: offset 100000000 is past the end of train-00000-of-00002.rec",
        ),
    ],
)
def test_a_broken_index_sidecar_is_one_dataset_error(packed_dir: Path, tmp_path: Path, damage, message: str) -> None:
    folder = tmp_path / "packed"
    shutil.copytree(packed_dir, folder)
    damage(folder)
    with pytest.raises(DatasetError, match=message) as info:
        open_shardset(folder)
    assert "\n" not in str(info.value)


def test_read_view_is_read_without_the_copy(indexed: Path, tmp_path: Path) -> None:
    """The loaders' ``read_view`` gives ``read``'s header and bytes as a view of one buffer, for a
    record of one frame and for one split around the RecordIO magic (several frames)."""
    payloads = [b"\xff\xd8" + bytes(range(200)), b"\xff\xd8\x00\x00" + MAGIC_BYTES * 3 + b"tail", b"\xff\xd8"]
    shards = open_shardset(with_payloads(indexed, tmp_path / "pack", dict(enumerate(payloads))))
    for i, payload in enumerate(payloads):
        header, data = shards.read(i)
        view_header, view = shards.read_view(i)
        assert isinstance(data, bytes) and isinstance(view, memoryview) and view.readonly
        assert data == view.tobytes() == payload and view_header == header and header.label == i
    assert shards.read_view(0)[1].obj is not shards.read_view(0)[1].obj  # each read its own buffer


@pytest.mark.interop
def test_bare_im2rec_files_as_path_list_and_glob(im2rec_files: list[Path], synth_tree: Path) -> None:
    """The .rec files MXNet's im2rec wrote (3 chunks, no manifest): labels from their IRHeaders, the images' own bytes."""
    rows = [line.split("\t") for rec in im2rec_files for line in rec.with_suffix(".lst").read_text().splitlines()]
    for spec in (im2rec_files, [str(r) for r in im2rec_files], str(im2rec_files[0].parent / "train_*.rec")):
        bare = open_shardset(spec)
        assert len(bare) == len(rows) == 48 and bare.classes is None and bare.source(11) is None
        assert bare.labels.tolist() == im2rec_labels(im2rec_files)  # read from the IRHeaders
        for i in (0, 17, 47):
            header, payload = bare.read(i)
            assert payload == (synth_tree / "train" / rows[i][2]).read_bytes() and header.id == int(rows[i][0]) == bare.keys[i]
    one = open_shardset(im2rec_files[1])
    assert len(one) == len(read_index(im2rec_files[1].with_suffix(".idx"))[0])


def test_file_handles_are_per_process_and_not_pickled(indexed: Path) -> None:
    """The local byte source opens shards lazily in each process, reopens after a fork and pickles without them."""
    s = open_shardset(indexed)
    expected = s.read(3)[1]
    local = s.byte_source
    assert local._fds  # opened lazily by the read
    clone = pickle.loads(pickle.dumps(s))
    assert clone.byte_source._fds == {} and clone.read(3)[1] == expected
    first = s.rec_names[0]
    parent_fd = local._fd(first)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must reopen, never reuse the parent's descriptor (dropped at the fork)
        ok = local._fds == {} and s.read(3)[1] == expected and local._fds
        os.write(write_end, b"1" if ok else b"0")
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1" and status == 0
    os.close(read_end)
    assert local._fd(first) == parent_fd  # the parent keeps its own handle


def test_dali_index_offsets_run_on_across_files(pack: Path) -> None:
    s = open_shardset(pack)
    path = write_dali_index(s)
    assert path.parent == pack
    keys, offsets = read_index(path)
    assert keys.tolist() == list(range(INDEXED_RECORDS))
    sizes = [p.stat().st_size for p in s.rec_paths]
    concat = b"".join(p.read_bytes() for p in s.rec_paths)
    assert offsets[0] == 0 and offsets.max() < sum(sizes)
    for i in range(len(s)):  # each offset points at record i inside the concatenation of the files
        from imgpipe.format.recordio import parse_record

        record, _ = parse_record(concat, int(offsets[i]), len(concat), "concat")
        assert unpack_header(record)[1] == s.read(i)[1]
    mtime = path.stat().st_mtime_ns
    assert write_dali_index(s) == path and path.stat().st_mtime_ns == mtime  # reused while up to date
    with open(s.rec_paths[-1], "ab") as f:
        f.write(b"\0" * 4)
    fresh = write_dali_index(open_shardset(pack))
    assert fresh != path and fresh.is_file() and not path.exists()  # the shards changed: a new index, the stale one gone


def test_dali_index_of_a_folder_a_glob_or_rec_paths_is_that_of_their_shard_set(pack: Path) -> None:
    s = open_shardset(pack)
    path = write_dali_index(s)
    assert write_dali_index(pack) == write_dali_index(str(pack)) == path
    for given in (f"{pack}/*.rec", [str(p) for p in s.rec_paths], tuple(s.rec_paths)):  # bare files: the same offsets
        assert read_index(write_dali_index(given))[1].tolist() == read_index(path)[1].tolist()
    one = s.rec_paths[1]  # a single bare .rec: an index of its own, offsets from 0
    keys, offsets = read_index(write_dali_index(one))
    assert offsets[0] == 0 and len(keys) == len(open_shardset(one))
    with pytest.raises(DatasetError, match="a ShardSet, a packed folder, a .rec file, a glob or a list of .rec files, got int"):
        write_dali_index(42)  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_dali_index_falls_back_to_the_cache_when_read_only(pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    s = open_shardset(pack)
    os.chmod(pack, 0o555)
    try:
        path = write_dali_index(s)
    finally:
        os.chmod(pack, 0o755)
    assert path.parent == tmp_path / "cache" / "imgpipe" and len(read_index(path)[0]) == INDEXED_RECORDS


def test_corrupt_record_bytes_raise_recordio_error(pack: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(pack, broken)
    s = open_shardset(broken)
    shard, start, _ = s.location(4)
    with open(s.rec_paths[shard], "r+b") as f:
        f.seek(start)
        f.write(b"\0\0\0\0")
    with pytest.raises(RecordIOError, match=rf"{s.rec_paths[shard].name}: offset {start}: bad magic"):
        s.read(4)
    with pytest.raises(IndexError, match="out of range"):
        s.read(INDEXED_RECORDS)


def older(damage):
    """``damage`` done to the folder as packs made before the index sidecar are: their .idx files are their index."""
    return lambda d: (without_index_sidecar(d), damage(d))


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda d: np.save(d / "train.labels.npy", np.zeros(5, np.int32)), "holds 5 values, the manifest counts 37 records"),
        (lambda d: np.save(d / "train.labels.npy", np.full(37, 99, np.int32)), r"record 0: label 99 is outside 0..36"),
        (lambda d: np.save(d / "train.labels.npy", np.zeros(37, np.float32)), r"must be a 1-D integer array, got float32"),
        (older(lambda d: (d / "train-00001-of-00003.idx").unlink()), "index is missing"),
        (older(lambda d: (d / "train-00001-of-00003.idx").write_text("0\t0\n")), "the manifest says"),
        (older(lambda d: (d / "train-00000-of-00003.idx").write_text("".join(f"{k}\t{k * 10**6}\n" for k in range(12)))), "past the end"),
        (
            lambda d: (d / "manifest.json").unlink(),
            "incomplete pack: all 3 shards written, no manifest.json; rerun the same 'imgpipe pack'",
        ),
        (lambda d: ((d / "manifest.json").unlink(), shutil.rmtree(d / ".imgpipe-pack")), None),  # shards alone: opened bare
    ],
)
def test_broken_folders_raise_one_line_dataset_errors(pack: Path, damage, message: str | None) -> None:
    damage(pack)
    if message is None:
        assert len(open_shardset(pack)) == INDEXED_RECORDS
        return
    with pytest.raises(DatasetError, match=message) as info:
        open_shardset(pack)
    assert "\n" not in str(info.value)


def test_missing_split_and_paths(pack: Path) -> None:
    with pytest.raises(DatasetError, match="no split 'val' \\(it has train\\)"):
        open_shardset(pack, "val")
    with pytest.raises(DatasetError, match="matches no files"):
        open_shardset(str(pack / "nothing-*.rec"))
    with pytest.raises(DatasetError, match="expected a .rec file"):
        open_shardset(pack / "manifest.json")
    with pytest.raises(DatasetError, match="no such file or folder"):
        open_shardset(pack / "nowhere")
