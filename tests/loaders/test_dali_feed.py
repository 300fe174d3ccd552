"""The DALI feed without DALI: decode windows around crop boxes, and batches in the sampler's order."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _packs import NOT_AN_IMAGE, with_payloads  # noqa: E402

from imgpipe.errors import DatasetError  # noqa: E402
from imgpipe.format.shardset import open_shardset  # noqa: E402
from imgpipe.image.jpeg import jpeg_size  # noqa: E402
from imgpipe.loaders.dali_feed import DaliFeed, window_of  # noqa: E402
from imgpipe.loaders.geometry import Crop, EvalGeometry, TrainGeometry, sample_crop  # noqa: E402


def test_a_fractional_box_gets_the_whole_pixel_window_around_it_and_its_place_inside() -> None:
    w = window_of(Crop(10.25, 3.5, 20.5, 7.0, True), 64, 48)
    assert (w.anchor, w.shape, w.mirror) == ((10, 3), (21, 8), 1)  # x 10..31, y 3..11
    assert w.roi_start == pytest.approx((0.5, 0.25)) and w.roi_end == pytest.approx((7.5, 20.75))  # (y, x)
    edge = window_of(Crop(0.0, 0.0, 64.0, 48.0), 64, 48)
    assert (edge.anchor, edge.shape, edge.roi_end, edge.mirror) == ((0, 0), (64, 48), (48.0, 64.0), 0)


@pytest.mark.parametrize("train", [True, False])
def test_a_batch_holds_each_records_bytes_and_its_own_crop(indexed: Path, train: bool) -> None:
    shards = open_shardset(indexed, "train")
    geometry = TrainGeometry(image_size=16) if train else EvalGeometry(image_size=16)
    feed = DaliFeed(shards, geometry, seed=4)
    indices = np.array([7, 2, 5])
    feed.start(3, [indices])
    payloads, anchor, shape, roi_start, roi_end, mirror, size = feed()
    assert list(feed.fed) == [indices] and not feed.queue
    assert size.dtype == np.float32 and size.tolist() == [[16.0, 16.0]] * 3
    assert anchor.dtype == shape.dtype == mirror.dtype == np.int32 and roi_start.dtype == np.float32 and anchor.shape == (3, 2)
    for k, index in enumerate(indices.tolist()):
        payload = shards.read(index)[1]
        assert payloads[k].tobytes() == payload
        width, height = jpeg_size(payload)
        window = window_of(sample_crop(geometry, width, height, seed=4, epoch=3, index=index), width, height)
        assert tuple(anchor[k]) == window.anchor and tuple(shape[k]) == window.shape and int(mirror[k]) == window.mirror
    with pytest.raises(StopIteration):
        feed()
    feed.close()


def test_batches_prepared_ahead_come_in_order_and_a_new_start_drops_them(indexed: Path) -> None:
    shards = open_shardset(indexed, "train")
    feed = DaliFeed(shards, TrainGeometry(image_size=16), seed=1)
    batches = [np.array([i, i + 1]) for i in range(0, 12, 2)]
    feed.start(0, batches)
    first = feed()
    assert [p.tobytes() for p in first[0]] == [shards.read(i)[1] for i in (0, 1)]
    feed.start(1, batches[3:])  # an epoch left unfinished: its prepared batches are dropped
    order = []
    while True:
        try:
            payloads = feed()[0]
        except StopIteration:
            break
        order.append([shards.read(i)[1] for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)].index(payloads[0].tobytes()))
    assert order == [6, 8, 10] and [b.tolist() for b in feed.fed] == [[6, 7], [8, 9], [10, 11]]
    feed.close()
    feed.start(2, batches[:1])  # after close, a start makes a new thread
    assert len(feed()[0]) == 2
    feed.close()


def test_a_batch_that_cannot_be_prepared_raises_when_dali_asks_for_it(indexed: Path, tmp_path: Path) -> None:
    shards = open_shardset(with_payloads(indexed, tmp_path / "t", {3: NOT_AN_IMAGE}), "train")
    feed = DaliFeed(shards, TrainGeometry(image_size=16), seed=1)
    feed.start(0, [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])])
    assert len(feed()[0]) == 2  # the batch before the bad record still comes
    with pytest.raises(DatasetError, match="record 3"):
        feed()
    feed.close()
