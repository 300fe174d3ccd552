"""The bench's instrumented torch loader builds the torch loader's batches, through the same shared-memory ring."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _tiny_shards import make_tiny_pack  # noqa: E402

from imgpipe.bench.probes import TimedReads, torch_batches  # noqa: E402
from imgpipe.loaders.torch import make_torch_loader  # noqa: E402
from imgpipe.format.shardset import open_shards  # noqa: E402


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 1])
def test_probe_batches_are_the_loaders_batches(tmp_path: Path, workers: int) -> None:
    data = make_tiny_pack(tmp_path / "tiny", records=40, shards=2, classes=4, min_side=32, max_side=80)
    common = {"rank": 0, "world_size": 1, "batch_size": 4, "image_size": 24, "seed": 3}
    probe = torch_batches(TimedReads(open_shards(data, "train")), batches=10, device=torch.device("cpu"), workers=workers, **common)
    seen = []
    storages = set()
    for images, labels, read, decode, _collate in probe:
        assert read >= 0 and decode > 0
        storages.add(images.untyped_storage().data_ptr())
        seen.append((images.clone(), labels.clone()))  # a ring slot is the consumer's only until it asks for the next batch
    loader = make_torch_loader(data, "train", workers=0, normalize=False, **common)
    assert len(seen) == len(loader) == 10
    for (x, y), (x0, y0) in zip(seen, loader):
        assert torch.equal(x, x0) and torch.equal(y, y0)
    if workers:  # every batch a slot of the one ring (without workers, freed batches' addresses get reused: no count)
        assert len(storages) == 1
