"""The sampling contract: disjoint equal full batches for train, exactly-once eval, epochs, block shuffle, resume."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgpipe.errors import ConfigError
from imgpipe.loaders.sampler import EpochSampler, batch_count, epoch_order, rank_indices


def _all_ranks(n: int, world: int, batch: int, **kw) -> list[np.ndarray]:
    return [rank_indices(n, seed=5, epoch=1, rank=r, world_size=world, batch_size=batch, **kw) for r in range(world)]


def _global_batches(parts: list[np.ndarray], batch: int) -> np.ndarray:
    """Every rank's batches joined step by step: row b is global batch b, ranks in order."""
    return np.stack([p.reshape(-1, batch) for p in parts], axis=1).reshape(len(parts[0]) // batch, -1)


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("n,batch", [(100, 4), (37, 3), (64, 8), (1000, 7)])
def test_train_drop_gives_disjoint_equal_full_batches(world: int, n: int, batch: int) -> None:
    if n < world * batch:
        with pytest.raises(ConfigError, match="remainder='pad'"):
            _all_ranks(n, world, batch)
        return
    parts = _all_ranks(n, world, batch)
    per_rank = (n // (world * batch)) * batch
    assert all(len(p) == per_rank for p in parts)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)  # disjoint, no duplicates
    assert n - len(joined) < world * batch  # only the tail is dropped
    assert all(batch_count(n, rank=r, world_size=world, batch_size=batch) == per_rank // batch for r in range(world))


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("n,batch", [(100, 4), (37, 3), (5, 8)])
def test_train_pad_covers_everything_with_equal_full_batches(world: int, n: int, batch: int) -> None:
    parts = _all_ranks(n, world, batch, remainder="pad")
    per_rank = -(-n // (world * batch)) * batch
    assert all(len(p) == per_rank for p in parts)
    joined = np.concatenate(parts)
    assert set(joined.tolist()) == set(range(n))
    # the global stream is the epoch order; padding repeats its start, nothing else
    order = epoch_order(n, 5, 1)
    assert _global_batches(parts, batch).ravel().tolist() == np.resize(order, len(joined)).tolist()


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 50, 101])
def test_eval_yields_every_record_exactly_once(world: int, n: int) -> None:
    batch = 4
    parts = _all_ranks(n, world, batch, train=False)
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(n))
    counts = [batch_count(n, rank=r, world_size=world, batch_size=batch, train=False) for r in range(world)]
    assert counts == [-(-len(p) // batch) for p in parts]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 8), batch=st.integers(1, 16), seed=st.integers(0, 2**32), epoch=st.integers(0, 50))
def test_partition_properties_hold_for_any_sizes(n: int, world: int, batch: int, seed: int, epoch: int) -> None:
    kw = dict(seed=seed, epoch=epoch, world_size=world, batch_size=batch)
    evals = [rank_indices(n, rank=r, train=False, **kw) for r in range(world)]
    assert sorted(np.concatenate(evals).tolist()) == list(range(n))
    pads = [rank_indices(n, rank=r, remainder="pad", **kw) for r in range(world)]
    assert len({len(p) for p in pads}) == 1 and len(pads[0]) % batch == 0
    assert n == 0 or set(np.concatenate(pads).tolist()) == set(range(n))


def test_order_depends_on_seed_and_epoch_only() -> None:
    a = epoch_order(1000, 1, 0)
    assert np.array_equal(a, epoch_order(1000, 1, 0))
    assert not np.array_equal(a, epoch_order(1000, 1, 1))
    assert not np.array_equal(a, epoch_order(1000, 2, 0))
    assert sorted(a.tolist()) == list(range(1000))


def test_block_shuffle_keeps_reads_local_and_still_shuffles() -> None:
    n, block, window = 1003, 50, 100
    order = epoch_order(n, 0, 0, block_size=block, window=window)
    assert sorted(order.tolist()) == list(range(n))
    for start in range(0, n, window):
        blocks = np.unique(order[start : start + window] // block)
        assert len(blocks) <= window // block + 1
    assert not np.array_equal(order, epoch_order(n, 0, 1, block_size=block, window=window))
    assert not np.array_equal(order[:window], np.sort(order[:window]))  # shuffled inside the window
    parts = [rank_indices(n, seed=0, epoch=0, rank=r, world_size=3, batch_size=10, block_size=block) for r in range(3)]
    assert len(np.unique(np.concatenate(parts))) == sum(len(p) for p in parts)


@pytest.mark.parametrize("huge", [2**62, 2**70])
def test_a_block_or_a_window_beyond_the_split_is_the_whole_split(huge: int) -> None:
    """block_shuffle=2**70 raised OverflowError, 2**62 'array is too big', at the loader's first batch: a block or a
    window larger than the split orders it as one exactly as large does."""
    for n in (1, 7, 1003):
        whole = epoch_order(n, 3, 2, block_size=n, window=n)
        assert np.array_equal(epoch_order(n, 3, 2, block_size=huge), whole)
        assert np.array_equal(epoch_order(n, 3, 2, block_size=huge, window=huge), whole)
        assert np.array_equal(epoch_order(n, 3, 2, block_size=5, window=huge), epoch_order(n, 3, 2, block_size=5, window=n))
    sampler = EpochSampler(48, batch_size=4, seed=1, rank=0, world_size=2, block_size=huge, window=huge)
    exact = EpochSampler(48, batch_size=4, seed=1, rank=0, world_size=2, block_size=48, window=48)
    assert [b.tolist() for b in sampler] == [b.tolist() for b in exact]


def test_epochs_advance_by_themselves_and_set_epoch_overrides() -> None:
    s = EpochSampler(40, batch_size=4, seed=1, rank=0, world_size=2)
    e0, e1 = [b.tolist() for b in s], [b.tolist() for b in s]
    assert s.epoch == 1 and e0 != e1
    assert e0 == [b.tolist() for b in s.batches(0)] and e1 == [b.tolist() for b in s.batches(1)]
    s.set_epoch(0)
    assert [b.tolist() for b in s] == e0
    assert [b.tolist() for b in s] == e1  # and it advances from there
    s.set_epoch(7)
    assert (s.state_dict()["epoch"], s.state_dict()["batches"]) == (7, 0)
    assert [b.tolist() for b in s] == [b.tolist() for b in s.batches(7)]
    next(iter(s))  # abandoned after one batch of epoch 8
    assert (s.state_dict()["epoch"], s.state_dict()["batches"]) == (8, 1)
    s.set_epoch(3)
    assert (s.state_dict()["epoch"], s.state_dict()["batches"]) == (3, 0)


def test_resume_mid_epoch_yields_exactly_the_remaining_batches() -> None:
    s = EpochSampler(50, batch_size=4, seed=3, rank=1, world_size=2)
    list(s)
    it = iter(s)
    taken = [next(it).tolist() for _ in range(2)]
    state = s.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 2)
    fresh = EpochSampler(50, batch_size=4, seed=3, rank=1, world_size=2)
    fresh.load_state_dict(state)
    rest = [b.tolist() for b in fresh]
    assert taken + rest == [b.tolist() for b in s.batches(1)]
    assert [b.tolist() for b in fresh] == [b.tolist() for b in s.batches(2)]


def test_state_after_a_full_epoch_points_at_the_next() -> None:
    s = EpochSampler(20, batch_size=5, rank=0, world_size=1)
    list(s)
    assert (s.state_dict()["epoch"], s.state_dict()["batches"]) == (1, 0)


@pytest.mark.parametrize("remainder", ["drop", "pad"])
@pytest.mark.parametrize("block", [None, 5])
def test_global_batches_are_the_same_at_every_world_size(remainder: str, block: int | None) -> None:
    """For one G = batch x world, global batch b holds the same records in the same order at any world size."""
    n, G = 250, 24
    for epoch in (0, 1):
        kw = dict(seed=7, epoch=epoch, remainder=remainder, block_size=block)
        one = rank_indices(n, rank=0, world_size=1, batch_size=G, **kw)
        assert one.tolist() == np.resize(epoch_order(n, 7, epoch, block_size=block), len(one)).tolist()
        for world in (2, 3, 4, 6, 8, 12, 24):
            batch = G // world
            parts = [rank_indices(n, rank=r, world_size=world, batch_size=batch, **kw) for r in range(world)]
            assert np.array_equal(_global_batches(parts, batch).ravel(), one), (epoch, world)


def test_state_saved_at_world_2_resumes_at_world_3_with_the_remaining_global_batches() -> None:
    n, G = 200, 12
    two = [EpochSampler(n, batch_size=6, seed=4, rank=r, world_size=2) for r in range(2)]
    for s in two:
        s.set_epoch(1)
    its = [iter(s) for s in two]
    taken = [np.concatenate([next(it) for it in its]) for _ in range(5)]
    state = two[0].state_dict()
    assert (state["epoch"], state["batches"], state["global_batch"]) == (1, 5, G)
    three = [EpochSampler(n, batch_size=4, seed=4, rank=r, world_size=3) for r in range(3)]
    for s in three:
        s.load_state_dict(state)
    rest = _global_batches([np.concatenate(list(s)) for s in three], 4)
    whole = rank_indices(n, seed=4, epoch=1, rank=0, world_size=1, batch_size=G).reshape(-1, G)
    assert np.array_equal(np.concatenate([np.stack(taken), rest]), whole)
    assert np.array_equal(np.concatenate(list(three[1])), rank_indices(n, seed=4, epoch=2, rank=1, world_size=3, batch_size=4))


def test_resume_names_the_batch_sizes_that_fit_another_global_batch() -> None:
    state = EpochSampler(50, batch_size=6, rank=0, world_size=2).state_dict()
    with pytest.raises(ConfigError, match=r"global batch 12, but this loader has batch_size 4 x 4 ranks = 16; use batch_size 3 on 4 ranks"):
        EpochSampler(50, batch_size=4, rank=0, world_size=4).load_state_dict(state)
    with pytest.raises(
        ConfigError, match=r"12 does not split over 5 ranks: use batch_size 12 on 1, 6 on 2, 4 on 3, 3 on 4, 2 on 6, 1 on 12 ranks"
    ):
        EpochSampler(50, batch_size=2, rank=0, world_size=5).load_state_dict(state)
    with pytest.raises(
        ConfigError, match="position in the record order of seed=0, but this loader has seed=1; make the loader with seed=0"
    ):
        EpochSampler(50, batch_size=6, seed=1, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(
        ConfigError, match="a split of 50 records, but this loader reads 49; load it into a loader over the split it was saved from"
    ):
        EpochSampler(49, batch_size=6, rank=0, world_size=2).load_state_dict(state)
    old = {k: v for k, v in state.items() if k != "global_batch"}  # states saved before global_batch was stored
    EpochSampler(50, batch_size=3, rank=0, world_size=4).load_state_dict(old)


@pytest.mark.parametrize(
    ("key", "value", "refused"),
    [
        ("epoch", "1", "must be an integer >= 0, got '1' (str)"),
        ("epoch", 2.0, "must be an integer >= 0, got 2.0 (float)"),
        ("epoch", -1, "must be >= 0, got -1"),
        ("batches", True, "must be an integer >= 0, got True (bool)"),
        ("batches", 2.5, "must be an integer >= 0, got 2.5 (float)"),  # was 2 batches, silently
        ("seed", "0", "must be an integer >= 0, got '0' (str)"),
        ("records", 50.0, "must be an integer >= 0, got 50.0 (float)"),
        ("global_batch", "x", "must be an integer >= 1, got 'x' (str)"),  # was a ValueError traceback
        ("world_size", 0, "must be >= 1, got 0"),
        ("batch_size", 6.0, "must be an integer >= 1, got 6.0 (float)"),
        ("resolution", True, "must be an integer >= 1, got True (bool)"),
    ],
)
def test_a_loader_state_count_that_is_not_an_int_in_range_is_one_config_error_naming_it(key: str, value: object, refused: str) -> None:
    """A loader state is read from a checkpoint: a count of another type is refused, not converted, and nothing of it is taken."""
    saved = EpochSampler(50, batch_size=6, seed=0, rank=0, world_size=2)
    saved.set_epoch(1)
    state = {**saved.state_dict(), "batches": 2}
    s = EpochSampler(50, batch_size=6, seed=0, rank=0, world_size=2)
    with pytest.raises(ConfigError, match=rf"^cannot resume: the loader state's {key} {re.escape(refused)}$"):
        s.load_state_dict({**state, key: value})
    assert s.state_dict() == EpochSampler(50, batch_size=6, seed=0, rank=0, world_size=2).state_dict()
    s.load_state_dict(state)  # the same state with that count as the int it was saved as
    assert (s.state_dict()["epoch"], s.state_dict()["batches"]) == (1, 2)


def test_rank_and_world_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    s = EpochSampler(90, batch_size=5)
    assert (s.rank, s.world_size) == (2, 3)
    assert np.array_equal(np.concatenate(list(s)), rank_indices(90, seed=0, epoch=0, rank=2, world_size=3, batch_size=5))


def test_bad_arguments_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="remainder"):
        EpochSampler(10, batch_size=2, remainder="wrap", rank=0, world_size=1)
    with pytest.raises(ConfigError, match="batch_size"):
        EpochSampler(10, batch_size=0, rank=0, world_size=1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 200), world=st.integers(1, 4), batch=st.integers(1, 9), epoch=st.integers(0, 5), data=st.data())
def test_resume_at_any_batch_matches_an_uninterrupted_epoch(n: int, world: int, batch: int, epoch: int, data) -> None:
    rank = data.draw(st.integers(0, world - 1))
    make = lambda: EpochSampler(n, batch_size=batch, seed=9, rank=rank, world_size=world, remainder="pad", block_size=3)  # noqa: E731
    whole = make()
    whole.set_epoch(epoch)
    expected = [b.tolist() for b in whole]
    consumed = data.draw(st.integers(0, len(expected)))
    first = make()
    first.set_epoch(epoch)
    it = iter(first)
    head = [next(it).tolist() for _ in range(consumed)]
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    if consumed < len(expected):
        resumed.set_epoch(epoch)  # the usual set_epoch before each epoch (Lightning's too) keeps the resume
    rest = [b.tolist() for b in resumed]
    if consumed < len(expected):
        assert head + rest == expected
    else:  # the epoch was complete: resuming starts the next one
        assert head == expected and rest == [b.tolist() for b in whole.batches(epoch + 1)]


def test_set_epoch_to_another_epoch_drops_a_pending_resume() -> None:
    s = EpochSampler(40, batch_size=4, seed=1, rank=0, world_size=1)
    s.load_state_dict({"epoch": 2, "batches": 3, "seed": 1, "records": 40, "global_batch": 4})
    s.set_epoch(5)
    assert [b.tolist() for b in s] == [b.tolist() for b in s.batches(5)]
    s.load_state_dict({"epoch": 2, "batches": 3, "seed": 1, "records": 40, "global_batch": 4})
    s.set_epoch(2)
    assert [b.tolist() for b in s] == [b.tolist() for b in s.batches(2)][3:]
    s.set_epoch(2)  # no resume pending any more: the whole epoch
    assert len(list(s)) == 10
