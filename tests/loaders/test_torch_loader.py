"""The torch loader end to end: real shards, real DataLoader workers, real gloo process group."""

from __future__ import annotations

import io
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parents[1]))
from _packs import INDEXED_RECORDS, NOT_AN_IMAGE, im2rec_labels, noisy_jpeg, with_payloads  # noqa: E402
from train.proctree import descendants, wait_gone  # noqa: E402

from imgpipe.errors import DatasetError  # noqa: E402
from imgpipe.format.shardset import open_shardset  # noqa: E402
from imgpipe.loaders.geometry import IMAGENET_MEAN, IMAGENET_STD, Crop, EvalGeometry, TrainGeometry  # noqa: E402
from imgpipe.loaders.pixels import UndecodableImage, decode_sample  # noqa: E402
from imgpipe.loaders.seeding import sample_rng  # noqa: E402
from imgpipe.loaders.torch import BatchRequest, BuiltBatch, make_torch_loader  # noqa: E402

SIZE = 32


def _run(loader, epochs: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.numpy().copy(), y.numpy().copy()) for _ in range(epochs) for x, y in loader]


def _uint8(packed_dir: Path, **kw):
    kw.setdefault("workers", 0)
    return make_torch_loader(packed_dir, batch_size=4, image_size=SIZE, normalize=False, rank=0, world_size=1, **kw)


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x1, x2) and np.array_equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


@pytest.fixture(params=["region decoder", "whole decode"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a decode test with the region decoder and as installs without it decode (torchvision, whole images)."""
    import imgpipe.loaders.pixels as pixels

    if request.param == "whole decode":
        monkeypatch.setattr(pixels, "region_decoder", lambda: None)
    elif pixels.region_decoder() is None:
        pytest.skip("the region decoder was not built (no libjpeg-turbo headers)")
    return request.param


# ------------------------------------------------------------------------------------------- output contract


def test_output_contract_normalized_and_uint8(packed_dir: Path) -> None:
    raw = _uint8(packed_dir)
    norm = make_torch_loader(packed_dir, batch_size=4, image_size=SIZE, workers=0, rank=0, world_size=1)
    assert len(raw) == len(norm) == 12
    raw_batches, norm_batches = _run(raw), _run(norm)
    assert len(raw_batches) == 12
    x8, y = raw_batches[0]
    assert x8.dtype == np.uint8 and x8.shape == (4, 3, SIZE, SIZE)
    xf, yf = norm_batches[0]
    assert xf.dtype == np.float32 and yf.dtype == np.int64 and np.array_equal(y, yf)
    mean = np.array(IMAGENET_MEAN, np.float32).reshape(1, 3, 1, 1)
    std = np.array(IMAGENET_STD, np.float32).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(xf, (x8.astype(np.float32) - mean) / std, rtol=1e-5, atol=1e-5)
    labels = open_shardset(packed_dir).labels
    order = np.concatenate(raw.sampler.batches(0))
    assert np.concatenate([b[1] for b in raw_batches]).tolist() == labels[order].tolist()


@pytest.mark.parametrize("normalize", [False, True])
def test_channels_last_holds_the_same_values(packed_dir: Path, normalize: bool) -> None:
    kw = dict(batch_size=4, image_size=SIZE, workers=1, rank=0, world_size=1, normalize=normalize, sample_transform=_stamp_first_pixel)
    plain = list(make_torch_loader(packed_dir, **kw))
    last = list(make_torch_loader(packed_dir, channels_last=True, **kw))
    assert len(plain) == len(last) == 12
    for (xp, yp), (xl, yl) in zip(plain, last):
        assert xp.is_contiguous() and xl.is_contiguous(memory_format=torch.channels_last) and xl.shape == (4, 3, SIZE, SIZE)
        assert torch.equal(xp, xl) and torch.equal(yp, yl)
    assert float(plain[0][0][0, 1, 2, 3]) == pytest.approx(7 if not normalize else (7 - IMAGENET_MEAN[1]) / IMAGENET_STD[1], rel=1e-6)


def _stamp_first_pixel(image: torch.Tensor) -> torch.Tensor:
    """A user transform that returns a new tensor: the loader copies it into the batch slot."""
    image = image.clone()
    image[1, 2, 3] = 7
    return image


def test_train_pixels_are_the_seeded_crop_of_the_record(packed_dir: Path) -> None:
    loader = _uint8(packed_dir, seed=11)
    images, _ = next(iter(loader))
    index = int(loader.sampler.batches(0)[0][0])
    payload = open_shardset(packed_dir).read(index)[1]
    crop = TrainGeometry(image_size=SIZE).sample(*Image.open(io.BytesIO(payload)).size, sample_rng(11, 0, index))
    assert _mad(images[0], _pillow_reference(payload, crop)) < 4  # equal, up to decoding at reduced size in the DCT domain


@pytest.mark.usefixtures("decode_path")
@pytest.mark.parametrize(
    "crop", [Crop(10.0, 20.0, 320.0, 240.0, False), Crop(100.0, 0.0, 200.0, 300.0, True), EvalGeometry(image_size=SIZE).crop(400, 300)]
)
def test_reduced_dct_decode_matches_a_full_decode(crop: Crop) -> None:
    payload = noisy_jpeg(np.random.default_rng(0), 400, 300)
    fast = decode_sample(payload, lambda w, h: crop, SIZE)  # 10x reduction: decoded at 1/8 scale
    assert fast.shape == (3, SIZE, SIZE) and fast.dtype == torch.uint8
    assert _mad(fast, _pillow_reference(payload, crop)) < 3


def _pillow_reference(payload: bytes, crop: Crop, size: int = SIZE) -> torch.Tensor:
    """The crop as Pillow computes it from a full decode: resize(box=...) then the flip."""
    image = Image.open(io.BytesIO(payload)).convert("RGB").resize((size, size), Image.Resampling.BILINEAR, box=crop.box)
    if crop.flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def _mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().mean())


@pytest.mark.usefixtures("decode_path")
@pytest.mark.parametrize(
    "crop",
    [
        Crop(0.0, 0.0, 400.0, 300.0),
        Crop(37.0, 11.0, 48.0, 40.0, True),
        Crop(5.0, 9.0, 20.0, 25.0),
        EvalGeometry(image_size=224).crop(400, 300),
    ],
)
def test_full_decode_matches_pillow_for_shrinking_growing_and_eval_boxes(crop: Crop) -> None:
    # below the draft threshold the JPEG is resampled by torch's resize; the
    # eval box is fractional in stored pixels (whole pixels of the resized image)
    payload = noisy_jpeg(np.random.default_rng(1), 400, 300)
    size = 48 if crop.width < 2 * 48 else 224
    ours = decode_sample(payload, lambda w, h: crop, size)
    expected = _pillow_reference(payload, crop, size)
    assert ours.shape == expected.shape
    match = _mad(ours, expected)
    assert match < 1.5  # resampling rounding; a one-pixel shift or a missed flip costs far more
    assert min(_mad(ours, expected.roll(1, dims=2)), _mad(ours, expected.flip(-1))) > max(3 * match, 2.0)


@pytest.mark.usefixtures("decode_path")
def test_an_extreme_aspect_eval_box_is_resampled_without_resizing_the_whole_image(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision import transforms as T

    import imgpipe.loaders.pixels as pixels

    payload = noisy_jpeg(np.random.default_rng(3), 1600, 60)  # 26:1; eval resizes it to 986 x 37 for a 32 x 32 crop
    largest: list[int] = [0]
    real_resize = pixels.resize

    def recording_resize(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
        largest[0] = max(largest[0], height * width)
        return real_resize(image, height, width)

    monkeypatch.setattr(pixels, "resize", recording_resize)
    ours = decode_sample(payload, EvalGeometry(image_size=SIZE).crop, SIZE)
    assert largest[0] <= pixels.WHOLE_RESIZE_MAX_AREA * SIZE * SIZE
    reference = T.Compose([T.Resize(EvalGeometry(image_size=SIZE).resize_shorter), T.CenterCrop(SIZE), T.PILToTensor()])
    assert _mad(ours, reference(Image.open(io.BytesIO(payload)).convert("RGB"))) < 1.5
    # an ordinary eval box still takes the torch path, with the whole-image resize
    decode_sample(noisy_jpeg(np.random.default_rng(3), 60, 50), EvalGeometry(image_size=SIZE).crop, SIZE)
    assert largest[0] > 0


@pytest.mark.usefixtures("decode_path")
def test_png_and_grayscale_records_decode_through_pillow() -> None:
    rgb = np.random.default_rng(2).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    for mode, fmt in (("RGB", "PNG"), ("L", "JPEG"), ("CMYK", "JPEG")):
        buffer = io.BytesIO()
        Image.fromarray(rgb).convert(mode).save(buffer, fmt)
        whole = Crop(0.0, 0.0, 80.0, 60.0)
        out = decode_sample(buffer.getvalue(), lambda w, h, whole=whole: whole, 40)
        assert out.shape == (3, 40, 40) and _mad(out, _pillow_reference(buffer.getvalue(), whole, 40)) < 2, (mode, fmt)


@pytest.mark.usefixtures("decode_path")
def test_a_header_over_the_bomb_limit_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = noisy_jpeg(np.random.default_rng(0), 400, 300)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 400 * 300 // 2 - 1)
    with pytest.raises(UndecodableImage, match="400x300"):
        decode_sample(payload, lambda w, h: Crop(0.0, 0.0, float(w), float(h)), SIZE)


@pytest.mark.usefixtures("decode_path")
def test_a_truncated_jpeg_fails_with_pillows_reason() -> None:
    payload = noisy_jpeg(np.random.default_rng(0), 400, 300)
    with pytest.raises(UndecodableImage, match="truncated"):
        decode_sample(payload[: len(payload) // 2], lambda w, h: Crop(0.0, 0.0, float(w), float(h)), SIZE)


def test_bytes_pillow_refuses_with_a_type_of_its_own_are_an_undecodable_image() -> None:
    """Pillow raises more than OSError and ValueError on bad bytes (a DDS header of unknown pixel format flags:
    NotImplementedError); pack and verify call any of them undecodable, and so does the loader."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "DDS")
    dds = bytearray(buffer.getvalue())
    dds[80:84] = (145).to_bytes(4, "little")  # the pixel format's flags
    with pytest.raises(UndecodableImage, match="Unknown pixel format flags 145"):
        decode_sample(bytes(dds), lambda w, h: Crop(0.0, 0.0, float(w), float(h)), SIZE)


def test_eval_matches_torchvision_resize_and_center_crop(packed_dir: Path) -> None:
    from torchvision import transforms as T

    loader = make_torch_loader(packed_dir, batch_size=8, train=False, image_size=SIZE, workers=0, normalize=False, rank=0, world_size=1)
    shards = open_shardset(packed_dir)
    geometry = EvalGeometry(image_size=SIZE)
    reference = T.Compose([T.Resize(geometry.resize_shorter, antialias=True), T.CenterCrop(SIZE), T.PILToTensor()])
    seen, differences = [], []
    for images, labels in loader:
        for image, label in zip(images, labels):
            index = len(seen)
            seen.append(index)
            expected = reference(Image.open(io.BytesIO(shards.read(index)[1])).convert("RGB"))
            assert int(label) == shards.labels[index]
            differences.append(_mad(image, expected))  # resampling differences only: a pixel's shift or a flip costs more
            assert differences[-1] < min(_mad(image, expected.roll(1, dims=2)), _mad(image, expected.flip(-1))), index
    assert seen == list(range(48))  # eval: unshuffled, every record once
    assert np.mean(differences) < 4.0


# ------------------------------------------------------------------------------------------- determinism


@pytest.mark.timeout(120)
def test_same_batches_for_any_worker_count_and_run(packed_dir: Path) -> None:
    reference = _run(_uint8(packed_dir, seed=3), epochs=2)
    assert not _equal(reference[:12], reference[12:])  # epochs differ
    assert _equal(reference, _run(_uint8(packed_dir, seed=3), epochs=2))  # runs reproduce
    for workers in (1, 2):
        assert _equal(reference, _run(_uint8(packed_dir, seed=3, workers=workers), epochs=2)), f"workers={workers}"
    assert not _equal(reference, _run(_uint8(packed_dir, seed=4), epochs=2))  # seeds differ


@pytest.mark.timeout(120)
def test_spawned_workers_give_the_same_batches(packed_dir: Path) -> None:
    # spawn pickles the dataset: the ShardSet travels without its file descriptors and reopens
    spawned = _uint8(packed_dir, seed=3, workers=1, multiprocessing_context="spawn")
    assert _equal(_run(spawned), _run(_uint8(packed_dir, seed=3)))


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_no_augmentation_collisions_across_ranks_workers_epochs(packed_dir: Path) -> None:
    """2 ranks x 4 workers x 3 epochs: every (epoch, record) has its own stream and its own crop."""
    geometry = TrainGeometry(image_size=224)
    streams, crops = {}, {}
    for rank in range(2):
        loader = make_torch_loader(packed_dir, batch_size=2, image_size=SIZE, workers=4, normalize=False, rank=rank, world_size=2, seed=5)
        single = make_torch_loader(packed_dir, batch_size=2, image_size=SIZE, workers=0, normalize=False, rank=rank, world_size=2, seed=5)
        assert _equal(_run(loader, epochs=3), _run(single, epochs=3))  # 4 workers draw exactly what 1 process draws
        for epoch in range(3):
            for index in loader.sampler.indices(epoch).tolist():
                assert (epoch, index) not in streams  # ranks are disjoint within an epoch
                stream = sample_rng(5, epoch, index)
                streams[(epoch, index)] = (stream.word(), stream.word())
                crops[(epoch, index)] = geometry.sample(4000, 3000, sample_rng(5, epoch, index))
    assert len(streams) == 3 * 48
    assert len(set(streams.values())) == len(streams)
    assert len(set(crops.values())) == len(crops)


def _stamp_numpy_draw(image: torch.Tensor) -> torch.Tensor:
    """A user transform with the classic bug pattern: it draws from numpy's GLOBAL generator."""
    value = int(np.random.randint(0, 2**31))
    image = image.clone()
    image[0, 0, :4] = torch.tensor(list(value.to_bytes(4, "little")), dtype=torch.uint8)
    return image


def _stamps(images: torch.Tensor) -> list[int]:
    return [int.from_bytes(bytes(img[0, 0, :4].tolist()), "little") for img in images]


class _NumpyDraws(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return int(np.random.randint(0, 2**31))


@pytest.mark.timeout(120)
def test_global_numpy_streams_are_distinct_per_worker_rank_and_epoch(packed_dir: Path) -> None:
    # The classic bug, still alive in torch 2.x: workers seed numpy from the main process's torch
    # seed, which DDP scripts set identically on every rank, so two ranks draw the same "random"
    # augmentations.
    plain = []
    for _rank in range(2):
        torch.manual_seed(0)
        plain.append([v.item() for v in torch.utils.data.DataLoader(_NumpyDraws(), batch_size=1, num_workers=2)])
    assert plain[0] == plain[1]
    # imgpipe reseeds numpy per (seed, epoch, rank, worker), persistent workers included.
    draws: list[int] = []
    for rank in range(2):
        torch.manual_seed(0)
        loader = make_torch_loader(
            packed_dir,
            batch_size=4,
            image_size=SIZE,
            workers=2,
            normalize=False,
            rank=rank,
            world_size=2,
            sample_transform=_stamp_numpy_draw,
        )
        for _epoch in range(2):
            for images, _ in loader:
                draws.extend(_stamps(images))
    assert len(draws) == 2 * 2 * 24
    assert len(set(draws)) == len(draws)


# ------------------------------------------------------------------------------------------- epochs and resume


def test_epochs_advance_and_set_epoch_overrides(packed_dir: Path) -> None:
    loader = _uint8(packed_dir)
    e0, e1 = _run(loader), _run(loader)
    assert loader.epoch == 1 and not _equal(e0, e1)
    loader.set_epoch(0)
    assert _equal(_run(loader), e0)
    assert _equal(_run(loader), e1)


@pytest.mark.timeout(120)
def test_resume_mid_epoch_equals_an_uninterrupted_run(packed_dir: Path) -> None:
    full = _run(_uint8(packed_dir, seed=2, workers=1), epochs=3)
    first = _uint8(packed_dir, seed=2, workers=1)
    _run(first)
    it = iter(first)
    head = [(x.numpy().copy(), y.numpy().copy()) for x, y in (next(it) for _ in range(3))]
    state = first.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 3)
    resumed = _uint8(packed_dir, seed=2, workers=1)
    resumed.load_state_dict(state)
    rest = _run(resumed)
    assert _equal(full[:12] + head + rest, full[:24])
    assert _equal(_run(resumed), full[24:])  # then the next epoch, as usual


# ------------------------------------------------------------------------------------------- ranks


@pytest.mark.parametrize("world", [1, 3, 8])
def test_ranks_get_disjoint_parts_and_equal_batch_counts(packed_dir: Path, world: int) -> None:
    loaders = [make_torch_loader(packed_dir, batch_size=2, image_size=SIZE, workers=0, rank=r, world_size=world) for r in range(world)]
    counts = {len(loader) for loader in loaders}
    assert counts == {48 // (2 * world)}
    indices = np.concatenate([loader.sampler.indices(0) for loader in loaders])
    assert len(np.unique(indices)) == len(indices)


@pytest.mark.interop
def test_bare_im2rec_files_by_glob_with_block_shuffle(im2rec_files: list[Path]) -> None:
    """The .rec files MXNet's im2rec wrote, without a manifest: labels from their IRHeaders, a block-shuffled order."""
    loader = _uint8(str(im2rec_files[0].parent / "*.rec"), seed=1, block_shuffle=4, shuffle_window=8)
    batches = _run(loader)
    order = np.concatenate(loader.sampler.batches(0))
    listed = im2rec_labels(im2rec_files)
    assert np.concatenate([y for _, y in batches]).tolist() == [listed[i] for i in order]  # im2rec's labels, in the loader's order
    assert not np.array_equal(order, np.sort(order))
    assert not _equal(batches, _run(_uint8(str(im2rec_files[0].parent / "*.rec"), seed=1)))


@pytest.mark.timeout(180)
def test_two_process_gloo_group_supplies_rank_and_world(packed_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, numpy as np, torch.distributed as dist
        from imgpipe.loaders.torch import make_torch_loader
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        loader = make_torch_loader({str(packed_dir)!r}, batch_size=4, image_size=16, workers=0)
        labels = np.concatenate([y.numpy() for _, y in loader])
        np.save(sys.argv[2], loader.sampler.indices(0))
        print(loader.sampler.rank, loader.sampler.world_size, len(loader), len(labels))
        dist.barrier()
        dist.destroy_process_group()
    """)
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(tmp_path / f"r{r}.npy")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=150) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o[0].split() for o in outs] == [["0", "2", "6", "24"], ["1", "2", "6", "24"]]
    a, b = np.load(tmp_path / "r0.npy"), np.load(tmp_path / "r1.npy")
    assert len(a) == len(b) == 24 and not set(a.tolist()) & set(b.tolist())


# ------------------------------------------------------------------------------------------- corrupt records


@pytest.fixture(scope="module")
def corrupt(packed_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``packed_dir`` with record 5's bytes replaced by bytes that are not an image."""
    return with_payloads(packed_dir, tmp_path_factory.mktemp("corrupt") / "c", {5: NOT_AN_IMAGE})


def test_corrupt_record_raises_naming_shard_record_and_source(corrupt: Path) -> None:
    loader = make_torch_loader(corrupt, batch_size=16, image_size=SIZE, workers=1, rank=0, world_size=1)
    with pytest.raises(DatasetError) as info:
        _run(loader)
    loader.close()
    message = str(info.value)
    shards = open_shardset(corrupt)
    assert "\n" not in message
    assert f"train-00000-of-00002.rec record 5 (id {shards.keys[5]}" in message and f"source {shards.source(5)}" in message


def test_skip_replaces_and_counts_without_changing_batches(corrupt: Path) -> None:
    loader = make_torch_loader(corrupt, batch_size=4, image_size=SIZE, workers=0, rank=0, world_size=1, on_corrupt="skip", normalize=False)
    batches = _run(loader, epochs=2)
    assert len(batches) == 24 and all(x.shape == (4, 3, SIZE, SIZE) for x, _ in batches)
    assert loader.skipped == 2  # record 5 once per epoch
    for epoch in range(2):  # the corrupt slot holds a copy of another sample of its batch, label included
        for b, batch in enumerate(loader.sampler.batches(epoch)):
            if 5 in batch.tolist():
                x, y = batches[epoch * 12 + b]
                slot = batch.tolist().index(5)
                donors = [s for s in range(4) if s != slot and np.array_equal(x[s], x[slot])]
                assert donors and y[slot] == y[donors[0]]


def test_a_batch_is_a_named_result_whose_error_is_a_typed_value(corrupt: Path) -> None:
    """What a worker hands back: fields by name, the failure as an exception to raise, no length that counts records."""
    loader = make_torch_loader(corrupt, batch_size=4, image_size=SIZE, workers=0, rank=0, world_size=1, normalize=False)
    good = loader.dataset[BatchRequest(0, np.arange(0, 4))]
    assert isinstance(good, BuiltBatch) and good.error is None and good.times is None and len(good.skipped) == 0
    assert good.images.shape == (4, 3, SIZE, SIZE) and good.labels.tolist() == open_shardset(corrupt, "train").labels[:4].tolist()
    bad = loader.dataset[BatchRequest(0, np.arange(4, 8))]  # record 5 does not decode
    assert isinstance(bad.error, DatasetError) and "record 5 " in str(bad.error)
    with pytest.raises(TypeError):
        len(loader.dataset)  # its items are batches, which the requests of a pass define


def test_a_record_whose_framing_is_broken_is_skipped_or_named(packed_dir: Path, tmp_path: Path) -> None:
    """A RecordIO framing error of one record (its magic overwritten on disk) is that record's failure, like an undecodable image."""
    folder = tmp_path / "framing"
    shutil.copytree(packed_dir, folder)
    shards = open_shardset(folder, "train")
    shard, start, _ = shards.location(3)
    with open(shards.rec_paths[shard], "r+b") as rec:
        rec.seek(start)
        rec.write(b"\0\0\0\0")
    with pytest.raises(DatasetError, match=r"^cannot decode train-\d{5}-of-\d{5}\.rec record 3 .*bad magic 0x00000000"):
        _run(_uint8(folder, shuffle=False))
    loader = _uint8(folder, shuffle=False, on_corrupt="skip")
    assert len(_run(loader)) == len(loader) and loader.skipped == 1


def _crop_bug(*args: object, **kwargs: object) -> Crop:
    raise ValueError("a bug in imgpipe's crop")


def _box_outside(geometry: object, width: int, height: int, **kwargs: object) -> Crop:
    return Crop(float(width), 0.0, float(width), float(height))  # a box right of the image: what a wrong crop could compute


def _resize_bug(*args: object) -> torch.Tensor:
    raise DatasetError("a bug in imgpipe's resize")


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize(
    ("module", "name", "bug", "raised", "message"),
    [
        ("imgpipe.loaders.torch", "sample_crop", _crop_bug, ValueError, "a bug in imgpipe's crop"),
        ("imgpipe.loaders.torch", "sample_crop", _box_outside, ValueError, "box can't exceed original image size"),
        ("imgpipe.loaders.pixels", "resize", _resize_bug, DatasetError, "a bug in imgpipe's resize"),
    ],
    ids=["crop-raises", "crop-box-outside", "resize-raises"],
)
def test_skip_never_hides_an_error_of_imgpipes_own_crop_or_resize(
    packed_dir: Path, monkeypatch: pytest.MonkeyPatch, workers: int, module: str, name: str, bug: object, raised: type, message: str
) -> None:
    """on_corrupt='skip' replaces a record whose bytes do not decode; a bug in imgpipe's geometry reaches the caller as it is."""
    monkeypatch.setattr(f"{module}.{name}", bug)
    loader = _uint8(packed_dir, workers=workers, on_corrupt="skip")
    with pytest.raises(raised, match=re.escape(message)):
        _run(loader)
    loader.close()
    assert loader.skipped == 0


# ------------------------------------------------------------------------------------------- memory


def _children() -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        text = (task / "children").read_text() if (task / "children").exists() else ""
        pids.update(int(p) for p in text.split())
    return pids


def _private_dirty_kb(pid: int) -> int:
    """The pages only this process has written: where heap growth and copy-on-read both show."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    raise AssertionError(f"no Private_Dirty for {pid}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [True, False], ids=["ring", "new-workers-each-epoch"])
def test_worker_memory_stays_flat_across_epochs(synth_pack, persistent: bool) -> None:
    # 8 batches of 864 KiB per epoch (the main process turns each into 3.4 MiB of float32). With
    # persistent workers they go through the shared-memory ring; without, every batch is a new
    # shared tensor, and the bug this guards against kept one batch per batch alive in glibc's
    # heap: torch keeps a small record of every storage sent between processes, and that record
    # landed inside the freed batch, so the next batch could not reuse the space. Workers then
    # grew by 3.4 MiB and the main process by 27 MiB per epoch, with no plateau.
    size, batch_size = 96, 32
    data = synth_pack(classes=4, per_class=64, min_side=48, max_side=96)  # 256 records
    before = _children()
    loader = make_torch_loader(data, batch_size=batch_size, image_size=size, workers=2, rank=0, world_size=1, persistent_workers=persistent)
    batch_kb = batch_size * 3 * size * size // 1024
    workers_kb: list[list[int]] = []
    main_kb: list[int] = []
    for _ in range(7):
        for _batch in loader:
            pass
        if persistent:
            workers = sorted(_children() - before)
            assert len(workers) == 2  # persistent workers: the same two processes every epoch
            workers_kb.append([_private_dirty_kb(pid) for pid in workers])
        main_kb.append(_private_dirty_kb(os.getpid()))
    for worker in range(len(workers_kb[0]) if workers_kb else 0):  # from the end of epoch 1 (warm) through 5 more epochs
        series = [epoch[worker] for epoch in workers_kb[1:]]
        assert max(series) - series[0] < 3 * batch_kb, workers_kb
    # the main process's heap keeps or returns a freed float32 batch or two from one epoch to the next
    # (glibc's trimming): growth shows as the last epochs' low point above the first epochs' high point
    assert min(main_kb[-3:]) - max(main_kb[1:3]) < 3 * 4 * batch_kb, main_kb  # at most ~3 float32 batches of slack


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetch_matches_cpu(packed_dir: Path) -> None:
    cpu = _run(make_torch_loader(packed_dir, batch_size=4, image_size=SIZE, workers=1, rank=0, world_size=1, device=None))
    loader = make_torch_loader(
        packed_dir, batch_size=4, image_size=SIZE, workers=1, rank=0, world_size=1, device="cuda", channels_last=True
    )
    gpu = [(x, y) for x, y in loader]
    assert len(gpu) == len(cpu)
    for (xg, yg), (xc, yc) in zip(gpu, cpu):
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last)
        np.testing.assert_allclose(xg.cpu().numpy(), xc, atol=1e-5)
        assert np.array_equal(yg.cpu().numpy(), yc)


# ------------------------------------------------------------------------------------------- geometry


def test_train_boxes_stay_in_torchvision_ranges() -> None:
    geometry = TrainGeometry(image_size=224)
    crops = [geometry.sample(500, 375, sample_rng(0, 0, i)) for i in range(2000)]
    for c in crops:
        assert 0 <= c.left and 0 <= c.top and c.left + c.width <= 500 and c.top + c.height <= 375
        assert 0.08 * 0.95 <= c.width * c.height / (500 * 375) <= 1.0
        assert 3 / 4 * 0.97 <= c.width / c.height <= 4 / 3 * 1.03
    assert 0.45 < np.mean([c.flip for c in crops]) < 0.55
    assert len({c[:4] for c in crops}) > 1900


def test_train_falls_back_to_torchvision_center_crop() -> None:
    # No box of area >= 8% fits a 1000x10 strip at ratio <= 4/3: torchvision's fallback is the
    # central crop at the closest ratio: height 10, width round(10 * 4/3) = 13.
    crop = TrainGeometry(image_size=8).sample(1000, 10, sample_rng(0, 0, 0))
    assert crop[:4] == ((1000 - 13) // 2, 0, 13, 10)


def test_eval_box_is_resize_shorter_then_center_crop() -> None:
    geometry = EvalGeometry(image_size=224)
    assert geometry.resize_shorter == 256
    crop = geometry.crop(500, 375)  # resized to 341x256, center 224 crop at (58, 16)
    scale_x, scale_y = 500 / 341, 375 / 256
    np.testing.assert_allclose(crop[:4], (58 * scale_x, 16 * scale_y, 224 * scale_x, 224 * scale_y))
    assert EvalGeometry(image_size=224).crop(256, 256)[:4] == (16.0, 16.0, 224.0, 224.0)


def test_train_batch_larger_than_the_split_is_a_clear_error(packed_dir: Path) -> None:
    with pytest.raises(DatasetError, match=r"split 'train' has 48 records: 24 per rank over 2 ranks, not one full batch of 32"):
        make_torch_loader(packed_dir, batch_size=32, image_size=SIZE, workers=0, rank=0, world_size=2)
    assert len(make_torch_loader(packed_dir, batch_size=32, image_size=SIZE, workers=0, rank=0, world_size=2, remainder="pad")) == 1
    batches = list(make_torch_loader(packed_dir, batch_size=64, image_size=SIZE, workers=0, rank=0, world_size=1, train=False))
    assert [len(y) for _, y in batches] == [48]


# ------------------------------------------------------------------------------------------- claims across world sizes


@pytest.mark.timeout(180)
def test_augmentation_does_not_depend_on_rank_or_world_size(indexed: Path) -> None:
    """The same (seed, epoch, record) gives the same pixels at world size 1, 2 and 3 (and any worker count)."""
    pixels: dict[int, dict[tuple[int, int], np.ndarray]] = {}
    for world in (1, 2, 3):
        seen = pixels.setdefault(world, {})
        for rank in range(world):
            loader = make_torch_loader(
                indexed, batch_size=2, image_size=SIZE, workers=rank % 2, normalize=False, rank=rank, world_size=world, seed=3
            )
            for epoch in range(2):
                for images, labels in loader:  # label = record index
                    for image, record in zip(images.numpy(), labels.tolist()):
                        assert (epoch, record) not in seen
                        seen[(epoch, record)] = image.copy()
            loader.close()
    assert [len(pixels[w]) for w in (1, 2, 3)] == [2 * 36] * 3  # drop: whole global batches of 2, 4, 6 (37 = 36 + 1)
    for world in (2, 3):
        common = pixels[1].keys() & pixels[world].keys()
        assert len(common) >= 2 * 30
        for key in common:
            assert np.array_equal(pixels[1][key], pixels[world][key]), (world, key)
    assert not np.array_equal(*(pixels[1][(e, r)] for e, r in [(0, 5), (1, 5)]))  # the epoch does change the crop


def _global_stream(loaders: list, epochs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every rank's batches joined step by step into (images, labels) global batches."""
    per_rank = [_run(loader, epochs) for loader in loaders]
    for loader in loaders:
        loader.close()
    return [(np.concatenate([x for x, _ in step]), np.concatenate([y for _, y in step])) for step in zip(*per_rank)]


@pytest.mark.timeout(240)
def test_world_sizes_1_to_4_give_pixel_identical_global_batches(packed_dir: Path) -> None:
    """G = 12: the same records, in the same order, with the same pixels, whether 1, 2, 3 or 4 ranks read them."""
    G = 12
    streams = {}
    for world in (1, 2, 3, 4):
        loaders = [
            make_torch_loader(
                packed_dir, batch_size=G // world, image_size=SIZE, workers=rank % 2, normalize=False, rank=rank, world_size=world, seed=3
            )
            for rank in range(world)
        ]
        streams[world] = _global_stream(loaders, epochs=2)
    assert len(streams[1]) == 2 * (48 // G)
    for world in (2, 3, 4):
        assert _equal(streams[world], streams[1]), world
    assert not _equal(streams[1][:4], streams[1][4:])  # epochs differ


@pytest.mark.timeout(240)
def test_state_saved_at_world_2_resumes_at_world_3_and_at_workers_0_from_2(packed_dir: Path) -> None:
    """48 records, G = 6: 8 global batches per epoch; stop after 2 of epoch 1 on 2 ranks, go on at 3 ranks and at 2 ranks
    without workers."""
    make = lambda world, rank, workers: make_torch_loader(  # noqa: E731
        packed_dir, batch_size=6 // world, image_size=SIZE, workers=workers, normalize=False, rank=rank, world_size=world, seed=8
    )
    whole = _global_stream([make(1, 0, 1)], epochs=3)
    first = [make(2, rank, 2) for rank in range(2)]
    for loader in first:
        _run(loader)  # epoch 0
    its = [iter(loader) for loader in first]
    for _ in range(2):  # two global batches of epoch 1
        for it in its:
            next(it)
    state = first[0].state_dict()
    assert state == first[1].state_dict() and (state["epoch"], state["batches"], state["global_batch"]) == (1, 2, 6)
    for loader in first:
        loader.close()
    for world, workers in ((3, 1), (2, 0)):
        resumed = [make(world, rank, workers) for rank in range(world)]
        for loader in resumed:
            loader.load_state_dict(state)
        rest = _global_stream(resumed, epochs=2)
        assert _equal(whole[8:10] + rest, whole[8:24]), (world, workers)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_eval_yields_every_record_exactly_once_with_none_padded(indexed: Path, world: int) -> None:
    records: list[int] = []
    for rank in range(world):
        loader = make_torch_loader(indexed, "train", batch_size=4, train=False, image_size=SIZE, workers=1, rank=rank, world_size=world)
        batches = [(images.shape[0], labels.tolist()) for images, labels in loader]
        loader.close()
        assert len(batches) == len(loader) and all(n == len(labels) for n, labels in batches)
        records.extend(label for _, labels in batches for label in labels)  # label = record index
    assert len(records) == INDEXED_RECORDS and sorted(records) == list(range(INDEXED_RECORDS))


# ------------------------------------------------------------------------------------------- sample_transform


def _raises_value_error(image: torch.Tensor) -> torch.Tensor:
    raise ValueError("a bug in the user's transform")


def _returns_float(image: torch.Tensor) -> torch.Tensor:
    return image.float() / 255


def test_a_failing_sample_transform_is_never_taken_for_a_corrupt_record(packed_dir: Path) -> None:
    """Its exception reaches the caller as it is; on_corrupt='skip' must not hide it as skipped samples."""
    loader = _uint8(packed_dir, on_corrupt="skip", sample_transform=_raises_value_error)
    with pytest.raises(ValueError, match="a bug in the user's transform"):
        _run(loader)
    assert loader.skipped == 0


@pytest.mark.parametrize("workers", [0, 1])
def test_a_sample_transform_returning_another_dtype_or_shape_is_one_line(packed_dir: Path, workers: int) -> None:
    """A float in [0, 1] copied into the uint8 batch would silently be all zeros."""
    loader = _uint8(packed_dir, workers=workers, sample_transform=_returns_float)
    with pytest.raises(
        DatasetError,
        match=r"sample_transform must return a uint8 tensor of shape \(3, 32, 32\), got torch.float32 \(3, 32, 32\) for train-0000",
    ):
        _run(loader)
    loader.close()


WORKERS_THEN_WAIT = """
import sys, threading
from imgpipe.loaders.torch import make_torch_loader

loader = make_torch_loader(sys.argv[1], batch_size=4, image_size=16, workers=2, device=None)
next(iter(loader))
print("ready", flush=True)
threading.Event().wait(120)  # held until the test kills it (two minutes at most)
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_at_once_with_a_killed_loader_process(packed_dir: Path) -> None:
    """A SIGKILLed training process leaves no loader workers behind."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen([sys.executable, "-c", WORKERS_THEN_WAIT, str(packed_dir)], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout.readline().strip() == "ready"
    assert_workers_die_with(child)


def assert_workers_die_with(child: subprocess.Popen) -> None:
    """Kill ``child`` once its two loader workers run: they must be gone within 10 s (and are killed here if not)."""
    import time

    deadline = time.monotonic() + 60
    while len(workers := descendants(child.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(workers) == 2
    child.kill()
    child.wait(timeout=30)
    left = wait_gone(workers, 10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"loader workers {left} outlived their killed process"


LATE_WORKERS = """
import os, sys, time
import imgpipe.loaders.torch as torch_loader

real = torch_loader.die_with_the_loader

def late(worker_id):
    parent, deadline = os.getppid(), time.monotonic() + 60
    while os.getppid() == parent and time.monotonic() < deadline:  # the test kills the loader's process: the worker is orphaned
        time.sleep(0.01)
    real(worker_id)

torch_loader.die_with_the_loader = late
loader = torch_loader.make_torch_loader(sys.argv[1], batch_size=4, image_size=16, workers=2, device=None)
next(iter(loader))
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_whose_loader_process_died_before_their_init_exit(packed_dir: Path) -> None:
    """A worker whose parent is already gone when its ``worker_init_fn`` runs does not watch its new parent forever."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    assert_workers_die_with(subprocess.Popen([sys.executable, "-c", LATE_WORKERS, str(packed_dir)], env=env))


def prefetched_in_a_thread(loader: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A wrapper users write: one epoch of ``loader`` iterated in a new thread, two batches ahead."""
    handed: queue.Queue = queue.Queue(2)

    def run() -> None:
        try:
            for batch in loader:
                handed.put(batch)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
            handed.put(error)
            return
        handed.put(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while (item := handed.get(timeout=60)) is not None:
        if isinstance(item, BaseException):
            raise item
        yield item
    thread.join()


@pytest.mark.timeout(120)
def test_persistent_workers_outlive_the_thread_that_started_them(packed_dir: Path) -> None:
    """Each epoch iterated by a new thread (which forks the workers in epoch 0, then exits): the same
    workers serve every epoch, and the batches are the loader's own."""
    loader = _uint8(packed_dir, workers=2)
    reference = _uint8(packed_dir)
    workers = None
    for epoch in range(3):
        assert _equal(_run(prefetched_in_a_thread(loader)), _run(reference)), f"epoch {epoch}"
        pids = {worker.pid for worker in loader._loader._iterator._workers}
        assert workers in (None, pids)  # persistent: never restarted
        workers = pids
    loader.close()


@pytest.mark.parametrize(
    ("kwargs", "warned"),
    [
        ({"pin_memory": True}, True),
        ({"pin_memory": True, "workers": 0}, False),
        ({"pin_memory": True, "persistent_workers": False}, False),
        ({}, False),
        ({"pin_memory": False}, False),
    ],
)
def test_pin_memory_on_a_cpu_loader_with_the_ring_is_one_warning(
    packed_dir: Path, caplog: pytest.LogCaptureFixture, kwargs: dict, warned: bool
) -> None:
    """The ring's slots are not pinned: ``pin_memory=True`` there says once that it has no effect."""
    from imgpipe.loaders.torch import PIN_MEMORY_IGNORED

    with caplog.at_level(logging.WARNING, logger="imgpipe.loaders.torch"):
        loader = _uint8(packed_dir, device=None, **{"workers": 1, **kwargs})
    loader.close()
    assert [r.getMessage() for r in caplog.records if "pin_memory" in r.getMessage()] == ([PIN_MEMORY_IGNORED] if warned else [])
