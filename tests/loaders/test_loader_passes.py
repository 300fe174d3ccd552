"""A loader's passes, on both backends: one live pass at a time, and nothing left running after ``close()``.

Real shards, the real factories (DALI on the CPU), real worker processes and threads.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from imgpipe.errors import ConfigError
from tests.train.proctree import descendants, wait_gone


def make(backend: str, path: Path, **kwargs: Any):
    kwargs = {"batch_size": 4, "image_size": 16, "workers": 2, "device": "cpu", "rank": 0, "world_size": 1, **kwargs}
    if backend == "torch":
        from imgpipe.loaders.torch import make_torch_loader

        return make_torch_loader(path, **kwargs)
    from imgpipe.loaders.dali import make_dali_loader

    return make_dali_loader(path, **kwargs)


def epoch_labels(backend: str, path: Path, epoch: int) -> list[list[int]]:
    reference = make(backend, path, workers=1)
    reference.set_epoch(epoch)
    labels = [y.tolist() for _, y in reference]
    reference.close()
    return labels


@pytest.mark.timeout(120)
def test_a_new_pass_ends_the_live_one_whose_iterator_then_raises(indexed: Path, backend: str) -> None:
    """``a = iter(loader); next(a); b = iter(loader); next(b); next(a)``: ``a`` may not go on with
    another pass's images or labels; ``b`` is epoch 1, whole and exact."""
    epoch0, epoch1 = epoch_labels(backend, indexed, 0), epoch_labels(backend, indexed, 1)
    loader = make(backend, indexed)
    a = iter(loader)
    assert next(a)[1].tolist() == epoch0[0]
    b = iter(loader)
    seen = [next(b)[1].tolist()]
    with pytest.raises(ConfigError, match="one pass at a time; take batches from the newest iterator"):
        next(a)
    seen += [y.tolist() for _, y in b]
    assert seen == epoch1
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (2, 0)
    loader.close()


@pytest.mark.timeout(120)
def test_an_iterator_left_unread_or_dropped_does_not_stop_the_next_pass(indexed: Path, backend: str) -> None:
    loader = make(backend, indexed)
    unread = iter(loader)  # never read: no pass begun, no epoch used up (Lightning's iterability check)
    sanity = iter(loader)
    next(sanity)  # abandoned after one batch, still referenced (Lightning's sanity check)
    assert [y.tolist() for _, y in loader] == epoch_labels(backend, indexed, 1)
    del unread, sanity
    loader.close()


def threads() -> tuple[int, set[threading.Thread]]:
    """This process's threads: how many the kernel counts (DALI's own included), and Python's."""
    return len(os.listdir("/proc/self/task")), set(threading.enumerate())


def started_since(before: tuple[int, set[threading.Thread]]) -> list[str]:
    """The names of Python's threads alive now that were not in ``before`` (by identity: an earlier test's
    thread that ends meanwhile, or one of the same name, is told apart)."""
    return sorted(thread.name for thread in threading.enumerate() if thread not in before[1])


def leftover_threads(before: tuple[int, set[threading.Thread]], timeout: float = 2.0) -> tuple[int, list[str]]:
    """How many more kernel threads than ``before`` this process runs, and Python's threads not in ``before``,
    once none is left or after ``timeout`` seconds. The kernel's count may lag a joined thread's exit by a
    moment, and may fall below ``before`` when an earlier test's native thread ends meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        extra = (max(0, threads()[0] - before[0]), started_since(before))
        if extra == (0, []) or time.monotonic() >= deadline:
            return extra
        time.sleep(0.01)


@pytest.mark.timeout(120)
def test_close_ends_a_live_pass_and_leaves_no_thread_or_process(indexed: Path, backend: str) -> None:
    gc.collect()  # earlier tests' loaders are gone before the count
    before, children = threads(), set(descendants(os.getpid()))
    loader = make(backend, indexed)
    live = iter(loader)
    next(live)
    assert threads() != before  # the pass runs threads (DALI's, the feed's; the DataLoader's queue feeders)
    workers = set(descendants(os.getpid())) - children
    loader.close()
    assert started_since(before) == []  # Python's threads are joined by close() itself
    assert leftover_threads(before) == (0, [])
    assert wait_gone(sorted(workers), 10) == []
    with pytest.raises(ConfigError, match=r"the loader was closed \(loader.close\(\)\)"):
        next(live)
    with pytest.raises(ConfigError, match=r"the loader was closed"):
        next(iter(loader))
    assert leftover_threads(before, timeout=0) == (0, [])
