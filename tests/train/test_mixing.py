"""train.mixup_alpha / train.cutmix_alpha: per-sample draws from (seed, epoch, record), targets that sum to one
with their lambda, and the same mixed samples whatever the world size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from imgpipe.errors import ConfigError
from imgpipe.loaders.sampler import rank_indices
from imgpipe.loaders.seeding import SampleStream
from imgpipe.train.mixing import Mixing, beta

CLASSES = 5
SIZE = 16


def batch(records: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Images that say which record they are (every pixel of record r is r + its channel / 10), and labels r % CLASSES."""
    images = torch.tensor(records, dtype=torch.float32).view(-1, 1, 1, 1) + torch.arange(3).view(1, 3, 1, 1) / 10
    return images.expand(-1, 3, SIZE, SIZE).contiguous(), torch.tensor(records % CLASSES)


@pytest.mark.parametrize(("mixup", "cutmix"), [(0.2, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_targets_sum_to_one_with_their_lambda_and_the_pixels_follow_it(mixup: float, cutmix: float) -> None:
    mixing = Mixing(mixup, cutmix, seed=4)
    records = np.array([11, 3, 7, 20, 8, 1, 14, 5])
    images, labels = batch(records)
    mixed, targets = mixing.apply(images, labels, records, epoch=2, classes=CLASSES)
    torch.testing.assert_close(targets.sum(1), torch.ones(len(records)))
    kinds = set()
    for k, record in enumerate(records.tolist()):
        partner = k ^ 1
        draw = mixing.draw(2, record, SIZE)
        kinds.add(draw.cutmix)
        own, other = images[k], images[partner]
        if draw.cutmix:
            top, bottom, left, right = draw.box
            inside = torch.zeros(SIZE, SIZE, dtype=torch.bool)
            inside[top:bottom, left:right] = True
            assert torch.equal(mixed[k][:, inside], other[:, inside]) and torch.equal(mixed[k][:, ~inside], own[:, ~inside])
            assert draw.lam == pytest.approx(1 - inside.sum().item() / SIZE**2)
        else:
            torch.testing.assert_close(mixed[k], draw.lam * own + (1 - draw.lam) * other)
        want = torch.zeros(CLASSES)
        want[labels[k]] += draw.lam
        want[labels[partner]] += 1 - draw.lam
        torch.testing.assert_close(targets[k], want)
        assert 0.0 <= draw.lam <= 1.0
    assert kinds == {False} if not cutmix else kinds == {True} if not mixup else kinds == {False, True}


def test_draws_depend_on_seed_epoch_and_record_alone() -> None:
    mixing = Mixing(0.4, 0.0, seed=1)
    assert mixing.draw(3, 17, SIZE) == mixing.draw(3, 17, SIZE)
    lams = {mixing.draw(e, r, SIZE).lam for e in range(3) for r in range(20)}
    assert len(lams) == 60  # every (epoch, record) its own draw
    assert Mixing(0.4, 0.0, seed=2).draw(3, 17, SIZE) != mixing.draw(3, 17, SIZE)
    both = Mixing(0.4, 1.0, seed=1)
    assert both.draw(3, 17, SIZE) == both.draw(3, 17, SIZE)


@pytest.mark.parametrize("mixup,cutmix", [(0.2, 0.0), (0.5, 1.0)])
def test_a_global_batch_mixes_the_same_at_world_sizes_1_2_and_3(mixup: float, cutmix: float) -> None:
    """G = 12: each rank mixes its slice (an even per-rank batch holds whole pairs); joined, the slices are world 1's batch."""
    mixing = Mixing(mixup, cutmix, seed=9)
    n, G = 40, 12
    streams = {}
    for world in (1, 2, 3):
        steps = []
        for rank in range(world):
            indices = rank_indices(n, seed=9, epoch=1, rank=rank, world_size=world, batch_size=G // world).reshape(-1, G // world)
            steps.append([mixing.apply(*batch(records), records, epoch=1, classes=CLASSES) for records in indices])
        streams[world] = [(torch.cat([x for x, _ in step]), torch.cat([t for _, t in step])) for step in zip(*steps)]
    for world in (2, 3):
        for (x, t), (x1, t1) in zip(streams[world], streams[1], strict=True):
            assert torch.equal(x, x1) and torch.equal(t, t1)


def test_an_odd_batch_cannot_pair_up() -> None:
    records = np.arange(5)
    with pytest.raises(ConfigError, match="even per-rank batch"):
        Mixing(0.2, 0.0, seed=0).apply(*batch(records), records, epoch=0, classes=CLASSES)


@pytest.mark.parametrize("alpha", [0.2, 1.0, 3.0])
def test_lambda_follows_the_beta_distribution(alpha: float) -> None:
    draws = np.array([beta(alpha, SampleStream(7, k)) for k in range(20000)])
    variance = alpha * alpha / ((2 * alpha) ** 2 * (2 * alpha + 1))
    assert draws.mean() == pytest.approx(0.5, abs=0.01)
    assert draws.var() == pytest.approx(variance, rel=0.05)
    assert ((draws >= 0) & (draws <= 1)).all()
