"""Both loader factories return a ``Loader``; DALI's state round trip resumes where it stopped.

Real shards, the real factories (DALI on the CPU, device_id None): no stand-ins.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from imgpipe.loaders.base import Loader
from imgpipe.loaders.torch import make_torch_loader


def test_the_torch_loader_is_a_loader(packed_dir: Path) -> None:
    loader = make_torch_loader(packed_dir, batch_size=4, image_size=32, workers=0)
    try:
        assert isinstance(loader, Loader) and loader.skipped == 0
    finally:
        loader.close()


def test_the_dali_loader_is_a_loader_and_resumes_where_it_stopped(packed_dir: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("require_dali")
    from imgpipe.loaders.dali import make_dali_loader

    def make() -> Loader:
        return make_dali_loader(packed_dir, batch_size=4, image_size=32, workers=1, device="cpu", normalize=False)

    whole = make()
    assert isinstance(whole, Loader) and whole.skipped == 0
    expected = [labels.clone() for _, labels in whole]
    assert len(expected) == len(whole) > 2

    first = make()
    batches = iter(first)
    seen = [next(batches)[1].clone() for _ in range(2)]
    state = first.state_dict()
    assert state["epoch"] == 0 and state["batches"] == 2
    first.close()

    resumed = make()
    resumed.load_state_dict(state)
    rest = [labels.clone() for _, labels in resumed]
    assert all(torch.equal(a, b) for a, b in zip(seen + rest, expected)) and len(seen + rest) == len(expected)
    after = resumed.state_dict()  # a finished epoch is the start of the next one in the global stream
    assert (after["epoch"], after["batches"]) == (1, 0)
