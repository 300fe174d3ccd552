"""Shared-memory batch slots that the torch loader's workers decode into, batch after batch.

A DataLoader worker that returns a new tensor sends it through a new shared-memory file: for
every batch the worker creates the file and faults its pages in, the main process maps them and
faults them in again, and both unmap them afterwards. On 2 cores that cost the loader 10-15 %
of its throughput (``benchmarks/loaders.py``). A ``BatchRing`` is allocated in shared memory
once, before the workers start (forked workers inherit it; spawned ones receive it once, with
the dataset); each request names a slot, the worker decodes into that slot and returns the
slot's number, and the main process copies the slot out (normalizing it, or into pinned
memory) before it asks the DataLoader for the next batch.

Why a slot is free when it is handed out again: a DataLoader keeps ``workers *
prefetch_factor`` requests (P) ahead of the batch it returns, and takes the next request from
its sampler just before returning a batch. With P + 1 slots, request j reuses the slot of
request j - P - 1, which the main process has copied out by then. ``claim`` checks it anyway:
a slot whose batch has not been released is never handed out again, and that request goes
without a slot (its worker allocates a new shared tensor, as without the ring).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from imgpipe.errors import ConfigError
from imgpipe._sys.meminfo import MEMINFO, available_memory

SHARED_MEMORY_DIR = "/dev/shm"


class BatchRing:
    """``slots`` uint8 batches of ``batch_size`` images in shared memory, claimed and released in request order."""

    def __init__(self, slots: int, *, batch_size: int, image_size: int, memory_format: torch.memory_format) -> None:
        self.slots = slots
        self.batch_size = batch_size
        shape = (slots * batch_size, 3, image_size, image_size)
        size = slots * batch_size * 3 * image_size * image_size
        with allocation_lock():  # ranks starting together check and allocate one after the other
            check_shared_memory(size, slots)
            try:
                self.images = torch.empty(shape, dtype=torch.uint8, memory_format=memory_format).share_memory_()
            except RuntimeError as e:  # something other than a ring took the room after the check
                raise shared_memory_error(size, slots, f"{SHARED_MEMORY_DIR} ran out ({str(e).splitlines()[0]})") from None
        self._claimed = 0  # requests that asked for a slot, ever
        self._released = 0  # of those, the ones whose batch the main process has copied out

    @classmethod
    def for_dataloader(cls, workers: int, prefetch_factor: int, *, batch_size: int, image_size: int, memory_format: torch.memory_format) -> BatchRing:
        """The ring a DataLoader with these ``workers`` and ``prefetch_factor`` needs: its requests in
        flight, and the batch being copied out."""
        return cls(workers * prefetch_factor + 1, batch_size=batch_size, image_size=image_size, memory_format=memory_format)

    def claim(self) -> int | None:
        """The slot for the next request; None when that slot's last batch has not been released yet."""
        request = self._claimed
        self._claimed += 1
        if request - self._released >= self.slots:
            return None
        return request % self.slots

    def release(self) -> None:
        """The oldest unreleased request's batch has been copied out: its slot may be reused."""
        self._released += 1

    def begin_pass(self) -> None:
        """A new pass over the DataLoader: nothing claimed before it is read any more.

        Safe because a persistent-worker DataLoader finishes (and discards) every request of an
        abandoned pass before it takes the first request of the next one.
        """
        self._released = self._claimed

    def batch(self, slot: int, count: int) -> torch.Tensor:
        """The first ``count`` images of ``slot`` (a view into shared memory)."""
        start = slot * self.batch_size
        return self.images[start : start + count]


@contextlib.contextmanager
def allocation_lock(folder: str = SHARED_MEMORY_DIR) -> Iterator[None]:
    """Hold an exclusive lock on ``folder``/.imgpipe-ring.lock: without it, every rank of a node
    checks the room before any has allocated, they all pass, and together they exhaust it
    (the OOM killer then ends a rank without a message).
    No lock where the file cannot be opened, or without ``fcntl`` (not Unix)."""
    try:
        import fcntl

        fd = os.open(os.path.join(folder, ".imgpipe-ring.lock"), os.O_RDONLY | os.O_CREAT, 0o666)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def check_shared_memory(size: int, slots: int, folder: str = SHARED_MEMORY_DIR, meminfo: str = MEMINFO) -> None:
    """Refuse a ring larger than the free space of ``folder`` (a tmpfs) or than the memory available
    (tmpfs pages are memory): torch would fail to allocate it, or the kernel's OOM killer would
    end the process while ``share_memory_`` writes it."""
    try:
        stats = os.statvfs(folder)
    except OSError:  # no such tmpfs here (not Linux): nothing to check
        return
    free = stats.f_bavail * stats.f_frsize
    if size > free:
        raise shared_memory_error(size, slots, f"{folder} has {free / 2**20:.0f} MiB free")
    memory = available_memory(meminfo)
    if memory is not None and size > memory:
        raise ConfigError(
            f"the torch loader's {slots} shared-memory batches need {size / 2**20:.0f} MiB but only "
            f"{memory / 2**20:.0f} MiB of memory is available; lower batch_size, workers or prefetch_factor"
        )


def shared_memory_error(size: int, slots: int, why: str) -> ConfigError:
    """The one-line error for a ring that does not fit in shared memory (``why``: what the tmpfs said)."""
    return ConfigError(
        f"the torch loader's {slots} shared-memory batches need {size / 2**20:.0f} MiB but {why}; "
        "enlarge it (docker run --shm-size=...) or lower batch_size, workers or prefetch_factor"
    )
