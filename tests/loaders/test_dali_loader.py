"""The DALI loader, for real: CPU pipelines (device_id=None) over real RecordIO shards.

Most tests use a tiny split whose label IS the record index, so every batch says exactly
which records it holds; ``packed_dir`` (the shared fixture) checks labels against a real pack.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from imgpipe.errors import ConfigError, DatasetError, ImgpipeError
from imgpipe.format.shardset import open_shardset
from imgpipe.loaders.sampler import rank_indices
from imgpipe.loaders.torch import make_torch_loader
from tests._packs import INDEXED_RECORDS, NOT_AN_IMAGE, im2rec_labels, with_payloads

pytestmark = [pytest.mark.dali, pytest.mark.usefixtures("require_dali")]  # conftest: skip only if not installed

RECORDS = INDEXED_RECORDS  # label = record index; prime: no world size or batch size divides it
SIZE = 32


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
@pytest.mark.parametrize("normalize", [True, False])
def test_batches_kept_by_the_caller_are_never_overwritten(indexed: Path, normalize: bool) -> None:
    """Batches are shared with DALI without a copy: every one kept must still hold its pixels after
    later batches, the next epoch and ``close()`` (DALI must not reuse a buffer the caller holds)."""
    dl = loader(indexed, batch_size=2, normalize=normalize, prefetch_factor=1, shuffle=False, train=False)
    kept = [(images, images.clone()) for epoch in range(2) for images, _ in dl]
    assert len(kept) == 2 * (RECORDS // 2 + 1)
    dl.close()
    import gc

    gc.collect()
    for held, copied in kept:
        assert torch.equal(held, copied)
    assert not torch.equal(kept[0][1], kept[1][1])  # distinct batches, so reuse would show


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size,batch_size", [(1, 5), (2, 4), (2, 5)])
def test_train_epochs_follow_the_global_stream(indexed: Path, world_size: int, batch_size: int) -> None:
    """Label = record index: every rank's batches are exactly the sampler's, full and equal in number."""
    expected = RECORDS // (world_size * batch_size)
    loaders = [loader(indexed, batch_size=batch_size, rank=r, world_size=world_size, seed=3) for r in range(world_size)]
    for epoch in range(2):
        for rank, dl in enumerate(loaders):
            assert len(dl) == expected
            want = rank_indices(RECORDS, seed=3, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size)
            assert epoch_labels(dl) == want.reshape(-1, batch_size).tolist()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size,batch_size", [(1, 5), (2, 4), (2, 11), (3, 4)])
def test_eval_every_record_exactly_once_over_ranks(indexed: Path, world_size: int, batch_size: int) -> None:
    loaders = [loader(indexed, batch_size=batch_size, train=False, rank=r, world_size=world_size) for r in range(world_size)]
    for _ in range(2):
        union = []
        for rank, dl in enumerate(loaders):
            batches = epoch_labels(dl)
            want = rank_indices(RECORDS, seed=0, epoch=0, rank=rank, world_size=world_size, batch_size=batch_size, train=False)
            assert len(batches) == len(dl) == -(-len(want) // batch_size)
            assert all(len(b) == batch_size for b in batches[:-1]) and 0 < len(batches[-1]) <= batch_size
            assert [k for b in batches for k in b] == want.tolist(), "eval is in stored order, no padding"
            union += [k for b in batches for k in b]
        assert sorted(union) == list(range(RECORDS))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_dali_and_torch_give_the_same_labels_and_nearly_the_same_pixels(indexed: Path, world_size: int, train: bool) -> None:
    """Same records, order, crops and flips; the pixels differ only by the resize filter (0-255 units)."""
    kw = dict(batch_size=4, image_size=SIZE, normalize=False, seed=5, train=train, world_size=world_size)
    for rank in range(world_size):
        ours = make_torch_loader(indexed, "train", workers=0, rank=rank, **kw)
        theirs = loader(indexed, rank=rank, **kw)
        for _ in range(2):  # two epochs
            a, b = list(ours), list(theirs)
            assert [y.tolist() for _, y in a] == [y.tolist() for _, y in b]
            x, y = torch.cat([i for i, _ in a]).float(), torch.cat([i for i, _ in b]).float()
            assert x.shape == y.shape
            assert float((x - y).abs().mean()) < 2.0  # the old DALI pipeline (its own crops) differed by ~67
            assert float((x - y).abs().mean(dim=(1, 2, 3)).max()) < 16.0  # noise images, a box shrunk in the DCT domain by torch


@pytest.mark.timeout(180)
def test_a_state_saved_at_world_2_resumes_at_world_1_and_in_the_torch_loader(indexed: Path) -> None:
    make = lambda world, rank: loader(indexed, batch_size=4 // world, rank=rank, world_size=world, seed=2)  # noqa: E731
    first = [make(2, r) for r in range(2)]
    its = [iter(dl) for dl in first]
    for _ in range(2):
        for it in its:
            next(it)
    state = first[0].state_dict()
    assert (state["epoch"], state["batches"], state["global_batch"]) == (0, 2, 4)
    resumed = make(1, 0)
    resumed.load_state_dict(state)
    want = rank_indices(RECORDS, seed=2, epoch=0, rank=0, world_size=1, batch_size=4).reshape(-1, 4)[2:].tolist()
    assert epoch_labels(resumed) == want
    in_torch = make_torch_loader(indexed, "train", batch_size=4, image_size=SIZE, workers=0, rank=0, world_size=1, seed=2)
    in_torch.load_state_dict(state)
    assert [y.tolist() for _, y in in_torch] == want


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
    for again in (run(7, workers=1), run(7, workers=2)):  # crops come from (seed, epoch, record): thread count does not matter
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


@pytest.mark.interop
@pytest.mark.timeout(120)
def test_bare_im2rec_files_by_glob_read_in_record_order(im2rec_files: list[Path]) -> None:
    from imgpipe.loaders.dali import make_dali_loader

    dl = make_dali_loader(str(im2rec_files[0].parent / "*.rec"), batch_size=8, train=False, image_size=SIZE, workers=1)
    assert [k for b in epoch_labels(dl) for k in b] == im2rec_labels(im2rec_files)  # record order across im2rec's 3 files


@pytest.mark.timeout(120)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize(("world_size", "rank", "position"), [(1, 0, 2), (1, 0, 29), (2, 1, 11)])
def test_a_record_that_does_not_decode_is_named_in_one_line(
    indexed: Path, tmp_path: Path, train: bool, world_size: int, rank: int, position: int
) -> None:
    """As the torch loader does: the shard, the record, its id, offset and source, in one line."""
    bad = int(rank_indices(RECORDS, seed=0, epoch=0, rank=rank, world_size=world_size, batch_size=3, train=train)[position])  # one it reads
    folder = with_payloads(indexed, tmp_path / "c", {bad: NOT_AN_IMAGE})
    dl = loader(folder, batch_size=3, train=train, rank=rank, world_size=world_size, on_corrupt="raise")
    with pytest.raises(DatasetError) as info:
        list(dl)
    message = str(info.value)
    shards = open_shardset(folder)
    shard, offset, _ = shards.location(bad)
    assert f"cannot decode {shards.rec_names[shard]} record {bad} (id {bad}, offset {offset}" in message, message
    assert f"source {shards.source(bad)}): not an image" in message
    assert "imgpipe verify --decode" in message and "\n" not in message


@pytest.mark.timeout(120)
def test_a_jpeg_that_dali_fails_to_decode_is_named_in_one_line(indexed: Path, tmp_path: Path) -> None:
    """A readable header but a cut scan: DALI's own decoder fails, and the batch in flight is searched for the record."""
    jpeg = open_shardset(indexed).read(5)[1]
    folder = with_payloads(indexed, tmp_path / "c", {5: jpeg[: jpeg.index(b"\xff\xda") + 14] + bytes(5)})  # the scan cut short
    dl = loader(folder, batch_size=4, train=False)
    with pytest.raises(DatasetError) as info:
        list(dl)
    message = str(info.value)
    assert message.startswith("cannot decode train-00000-of-00003.rec record 5 (id 5, offset ") and "truncated" in message, message
    assert "imgpipe verify --decode" in message and "\n" not in message


@pytest.mark.timeout(120)
def test_raw_readers_mxnet_reads_every_record_through_the_cumulative_index(indexed: Path) -> None:
    """For users who drive DALI's own reader: ``write_dali_index()`` maps all 3 .rec files as one, in record order."""
    from nvidia.dali import Pipeline, fn

    from imgpipe.format.shardset import open_shardset
    from imgpipe.loaders.dali_index import write_dali_index

    shards = open_shardset(indexed, "train")
    pipe = Pipeline(batch_size=5, num_threads=1, device_id=None)
    with pipe:
        _, labels = fn.readers.mxnet(
            path=[str(p) for p in shards.rec_paths], index_path=[str(write_dali_index(shards))], random_shuffle=False, name="Reader"
        )
        pipe.set_outputs(labels)
    pipe.build()
    seen: list[int] = []
    while len(seen) < RECORDS:
        (out,) = pipe.run()
        seen += [int(np.asarray(t).reshape(-1)[0]) for t in out]
    assert seen[:RECORDS] == list(range(RECORDS))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("prefetch_factor", [1, 2, 3])
def test_the_pipeline_is_built_once_when_each_epoch_stops_after_its_last_batch(
    indexed: Path, prefetch_factor: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Driven as ``imgpipe train`` drives it (leave the loop right after batch len(loader)), the loader
    reuses its pipeline every epoch; an epoch left before its last batch costs one new pipeline."""
    import imgpipe.loaders.dali as dali

    builds = []
    real_build = dali._build_pipeline
    monkeypatch.setattr(dali, "_build_pipeline", lambda *args: builds.append(1) or real_build(*args))
    dl = loader(indexed, batch_size=4, prefetch_factor=prefetch_factor, seed=5)
    reference = loader(indexed, batch_size=4, prefetch_factor=prefetch_factor, seed=5)
    for epoch in range(4):
        want = epoch_labels(reference)
        got = []
        for step, (_, labels) in enumerate(dl):
            got.append(labels.tolist())
            if step + 1 == (2 if epoch == 2 else len(dl)):  # epoch 2 is left after 2 batches
                break
        assert got == (want[:2] if epoch == 2 else want), f"epoch {epoch}"
    assert len(builds) == 1 + 1 + 1  # the reference's, dl's first, and dl's after the epoch left early
