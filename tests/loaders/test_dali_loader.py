"""The DALI loader, for real: CPU pipelines (device_id=None) over real RecordIO shards.

Most tests use a tiny split whose label IS the record index, so every batch says exactly
which records it holds; ``packed_dir`` (the shared fixture) checks labels against a real pack.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe.errors import ConfigError, DatasetError, ImgpipeError
from imgpipe.loaders.dali import epoch_seeds, shard_bounds
from imgpipe.format.manifest import Manifest, ShardInfo, SplitInfo, sha256_file, write_manifest
from imgpipe.format.recordio import IndexedRecordWriter, IRHeader, pack_header

pytestmark = [pytest.mark.dali, pytest.mark.usefixtures("require_dali")]  # conftest: skip only if not installed

RECORDS = 23  # prime: no world size or batch size divides it, so every remainder path runs
SIZE = 32


def write_indexed_split(dst: Path, records: int, shards: int, split: str = "train", seed: int = 0) -> None:
    """A packed folder whose record k has label k: random-noise JPEGs of 40-90 px, ``shards`` shards."""
    rng = np.random.default_rng(seed)
    infos, sources = [], []
    for s in range(shards):
        start, end = records * s // shards, records * (s + 1) // shards
        name = f"{split}-{s:05d}-of-{shards:05d}"
        rec, idx = dst / f"{name}.rec", dst / f"{name}.idx"
        with IndexedRecordWriter(rec, idx) as writer:
            for k in range(start, end):
                h, w = (int(v) for v in rng.integers(40, 90, 2))
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
                writer.write(2 * k, pack_header(IRHeader(0, float(k), 2 * k, 0), buf.getvalue()))
                sources.append(f"c{k:03d}/img{k}.JPEG")
        infos.append(ShardInfo(rec.name, idx.name, end - start, rec.stat().st_size, sha256_file(rec), idx.stat().st_size, sha256_file(idx)))
    atomic_write_bytes(dst / f"{split}.sources.txt", "".join(f"{p}\n" for p in sources).encode())
    buf = io.BytesIO()
    np.save(buf, np.arange(records, dtype=np.int32), allow_pickle=False)
    atomic_write_bytes(dst / f"{split}.labels.npy", buf.getvalue())
    split_info = SplitInfo(
        infos, f"{split}.sources.txt", sha256_file(dst / f"{split}.sources.txt"), f"{split}.labels.npy", sha256_file(dst / f"{split}.labels.npy")
    )
    write_manifest(dst, Manifest([f"c{k:03d}" for k in range(records)], {split: split_info}, {}, "synthetic"))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("indexed")
    write_indexed_split(dst, RECORDS, shards=3)
    return dst


def loader(path: Path, **kwargs):
    from imgpipe.loaders.dali import make_dali_loader

    kwargs.setdefault("image_size", SIZE)
    kwargs.setdefault("workers", 1)
    return make_dali_loader(path, "train", **kwargs)


def epoch_labels(dl) -> list[list[int]]:
    return [labels.tolist() for _, labels in dl]


@pytest.mark.timeout(120)
def test_output_contract_normalized_uint8_and_channels_last(indexed: Path) -> None:
    images, labels = next(iter(loader(indexed, batch_size=4)))
    assert images.dtype == torch.float32 and images.shape == (4, 3, SIZE, SIZE) and images.device.type == "cpu"
    assert labels.dtype == torch.int64 and labels.shape == (4,)
    assert -3.0 < float(images.min()) < 0 < float(images.max()) < 3.0  # normalized, not 0-255

    raw, _ = next(iter(loader(indexed, batch_size=4, normalize=False)))
    assert raw.dtype == torch.uint8 and raw.shape == (4, 3, SIZE, SIZE) and int(raw.max()) > 128

    cl, _ = next(iter(loader(indexed, batch_size=4, channels_last=True, train=False)))
    plain, _ = next(iter(loader(indexed, batch_size=4, train=False)))
    assert cl.shape == (4, 3, SIZE, SIZE) and cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(cl, plain)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size,batch_size", [(1, 5), (2, 4), (2, 5)])
def test_train_epochs_full_equal_batches_disjoint_ranks(indexed: Path, world_size: int, batch_size: int) -> None:
    expected = (RECORDS // world_size) // batch_size
    loaders = [loader(indexed, batch_size=batch_size, rank=r, world_size=world_size, seed=3) for r in range(world_size)]
    for epoch in range(2):
        per_rank = []
        for rank, dl in enumerate(loaders):
            assert len(dl) == expected
            batches = epoch_labels(dl)
            assert len(batches) == expected and all(len(b) == batch_size for b in batches)
            seen = [k for b in batches for k in b]
            assert len(set(seen)) == len(seen), "a record came twice in one rank's epoch"
            start, end = shard_bounds(RECORDS, (rank + epoch) % world_size, world_size)
            assert set(seen) <= set(range(start, end)), "rank read outside its shard of this epoch"
            per_rank.append(set(seen))
        if world_size == 2:
            assert not per_rank[0] & per_rank[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size,batch_size", [(1, 5), (2, 4), (2, 11), (3, 4)])
def test_eval_every_record_exactly_once_over_ranks(indexed: Path, world_size: int, batch_size: int) -> None:
    loaders = [loader(indexed, batch_size=batch_size, train=False, rank=r, world_size=world_size) for r in range(world_size)]
    for _ in range(2):
        union = []
        for rank, dl in enumerate(loaders):
            batches = epoch_labels(dl)
            start, end = shard_bounds(RECORDS, rank, world_size)
            assert len(batches) == len(dl) == -(-(end - start) // batch_size)
            assert all(len(b) == batch_size for b in batches[:-1]) and 0 < len(batches[-1]) <= batch_size
            assert [k for b in batches for k in b] == list(range(start, end)), "eval is in stored order, no padding"
            union += [k for b in batches for k in b]
        assert sorted(union) == list(range(RECORDS))


@pytest.mark.timeout(120)
def test_labels_match_the_packed_records(packed_dir: Path) -> None:
    from imgpipe.loaders.dali import make_dali_loader

    stored = np.load(packed_dir / "val.labels.npy", allow_pickle=False)
    dl = make_dali_loader(packed_dir, "val", batch_size=5, train=False, image_size=SIZE, workers=1)
    got = torch.cat([labels for _, labels in dl]).numpy()
    np.testing.assert_array_equal(got, stored)
    train_stored = np.load(packed_dir / "train.labels.npy", allow_pickle=False)
    dl = make_dali_loader(packed_dir, "train", batch_size=4, image_size=SIZE, workers=1, seed=1)
    got = torch.cat([labels for _, labels in dl]).numpy()
    classes = int(train_stored.max()) + 1
    assert len(got) == len(dl) * 4 and got.min() >= 0 and got.max() < classes
    assert np.all(np.bincount(got, minlength=classes) <= np.bincount(train_stored, minlength=classes)), "labels not from these records"


@pytest.mark.timeout(120)
def test_seeding_same_seed_reproduces_other_seed_and_epoch_differ(indexed: Path) -> None:
    def run(seed: int, workers: int, epoch: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        dl = loader(indexed, batch_size=4, seed=seed, workers=workers, normalize=False)
        dl.set_epoch(epoch)
        return list(dl)

    first = run(7, workers=1)
    for again in (run(7, workers=1), run(7, workers=2)):  # DALI CPU draws per sample: thread count does not matter
        assert [lab.tolist() for _, lab in again] == [lab.tolist() for _, lab in first]
        for (a, _), (b, _) in zip(again, first):
            assert torch.equal(a, b)
    other = run(8, workers=1)
    assert [lab.tolist() for _, lab in other] != [lab.tolist() for _, lab in first]
    # the same records under two seeds get different crops: compare record by record
    crops = {int(k): img for imgs, labs in first for img, k in zip(imgs, labs)}
    shared = [(crops[int(k)], img) for imgs, labs in other for img, k in zip(imgs, labs) if int(k) in crops]
    assert shared and all(not torch.equal(a, b) for a, b in shared)

    dl = loader(indexed, batch_size=4, seed=7, workers=1, normalize=False)
    list(dl)
    epoch1 = list(dl)  # the next iter() is the next epoch ...
    assert [lab.tolist() for _, lab in epoch1] != [lab.tolist() for _, lab in first]
    replay = run(7, workers=1, epoch=1)  # ... and set_epoch(1) on a fresh loader replays it exactly
    assert all(torch.equal(a, b) and torch.equal(x, y) for (a, x), (b, y) in zip(epoch1, replay))


def test_epoch_seeds_depend_on_seed_rank_and_epoch_only() -> None:
    seeds = {tuple(epoch_seeds(s, r, e).values()) for s in range(3) for r in range(3) for e in range(3)}
    assert len(seeds) == 27
    assert epoch_seeds(5, 1, 2) == epoch_seeds(5, 1, 2)
    assert all(0 <= v < 2**31 for v in epoch_seeds(5, 1, 2).values())


@pytest.mark.timeout(60)
def test_user_errors_are_imgpipe_errors(indexed: Path) -> None:
    with pytest.raises(DatasetError, match="lower batch_size"):
        loader(indexed, batch_size=RECORDS + 1)
    with pytest.raises(ConfigError, match="'mps'"):
        loader(indexed, batch_size=4, device="mps")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            loader(indexed, batch_size=4, device="cuda")
    with pytest.raises(ConfigError, match="batch_size"):
        loader(indexed, batch_size=0)
    with pytest.raises(ImgpipeError):
        loader(indexed / "nowhere", batch_size=4)


@pytest.mark.timeout(120)
def test_without_dali_the_error_says_how_to_install(indexed: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["nvidia.dali"] = None  # as if the wheel were not installed
        import imgpipe
        from imgpipe.errors import ImgpipeError
        from imgpipe.loaders.dali import dali_available
        assert not dali_available()
        try:
            imgpipe.make_dali_loader({str(indexed)!r}, batch_size=2)
        except ImgpipeError as e:
            print("ERROR:", e)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr
    assert "ERROR:" in result.stdout and "pip install 'imgpipe[dali]'" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(120)
def test_eval_epoch_restarts_cleanly_after_an_early_break(indexed: Path) -> None:
    dl = loader(indexed, batch_size=4, train=False)
    full = epoch_labels(dl)
    for _ in dl:
        break  # abandon the epoch after one batch
    assert epoch_labels(dl) == full == [list(range(k, min(k + 4, RECORDS))) for k in range(0, RECORDS, 4)]


@pytest.mark.timeout(120)
def test_bare_rec_files_by_glob_read_through_one_combined_index(indexed: Path) -> None:
    from imgpipe.loaders.dali import make_dali_loader

    dl = make_dali_loader(str(indexed / "train-*.rec"), batch_size=8, train=False, image_size=SIZE, workers=1)
    assert [k for b in epoch_labels(dl) for k in b] == list(range(RECORDS))  # record order across the 3 files


@pytest.mark.timeout(120)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize(("world_size", "rank", "bad"), [(1, 0, 2), (1, 0, 29), (2, 1, 22)])
def test_a_record_that_does_not_decode_is_named_in_one_line(tmp_path: Path, train: bool, world_size: int, rank: int, bad: int) -> None:
    """As the torch loader does: the shard, the record, its id, offset and source, in one line."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from _tiny_shards import make_tiny_pack

    folder = make_tiny_pack(tmp_path / "c", records=30, shards=2, classes=3, corrupt=(bad,))
    dl = loader(folder, batch_size=3, train=train, rank=rank, world_size=world_size, on_corrupt="raise")
    with pytest.raises(DatasetError) as info:
        list(dl)
    message = str(info.value)
    shard = "train-00000-of-00002.rec" if bad < 15 else "train-00001-of-00002.rec"
    assert f"cannot decode {shard} record {bad} (id {2 * bad}, offset " in message, message
    assert f"source train/n{bad % 3:08d}/n{bad % 3:08d}_{bad}.JPEG): not an image" in message
    assert "imgpipe verify --decode" in message and "\n" not in message
