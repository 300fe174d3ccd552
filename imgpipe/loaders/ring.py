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

import os

import torch

from imgpipe.errors import ConfigError

SHARED_MEMORY_DIR = "/dev/shm"


class BatchRing:
    """``slots`` uint8 batches of ``batch_size`` images in shared memory, claimed and released in request order."""

    def __init__(self, slots: int, *, batch_size: int, image_size: int, memory_format: torch.memory_format) -> None:
        self.slots = slots
        self.batch_size = batch_size
        shape = (slots * batch_size, 3, image_size, image_size)
        check_shared_memory(slots * batch_size * 3 * image_size * image_size, slots)
        self.images = torch.empty(shape, dtype=torch.uint8, memory_format=memory_format).share_memory_()
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


def check_shared_memory(size: int, slots: int, folder: str = SHARED_MEMORY_DIR) -> None:
    """Refuse a ring larger than the free space of ``folder`` (a tmpfs): ``share_memory_`` writes every
    page of it at once, and a tmpfs that runs out answers with a bus error that kills the process."""
    try:
        stats = os.statvfs(folder)
    except OSError:  # no such tmpfs here (not Linux): nothing to check
        return
    free = stats.f_bavail * stats.f_frsize
    if size > free:
        raise ConfigError(
            f"the torch loader's {slots} shared-memory batches need {size / 2**20:.0f} MiB but {folder} has "
            f"{free / 2**20:.0f} MiB free; enlarge it (docker run --shm-size=...) or lower batch_size, workers or prefetch_factor"
        )
