"""Shared-memory batch slots that the torch loader's workers build batches in, and that the caller gets without a copy.

A ``BatchRing`` is a fixed set of slots, allocated and faulted in once before the workers start: a
request names a slot, its worker builds the batch there and returns the slot's number, and the caller
gets a view of it (docs/measurements.md says why neither a new tensor nor a copy per batch will do).
Rule: a slot is built in again only once its batch has come back and the caller holds nothing on it
(``storage_use_count``; what holds a slot: docs/api.md), so a batch never changes while it is held; a
request whose slot is still held goes without one, and its worker allocates a new shared tensor.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

import torch

from imgpipe._sys.meminfo import available_memory
from imgpipe._sys.pidlock import lock_file
from imgpipe._sys.torch_private import storage_use_count
from imgpipe.errors import ConfigError

SHARED_MEMORY_DIR = "/dev/shm"
HANDOVER_SLOTS = 2  # beyond the requests in flight: the batch being handed over and the one the caller holds


def ring_slots(workers: int, prefetch_factor: int) -> int:
    """The batches a DataLoader with these ``workers`` and ``prefetch_factor`` holds at once: its requests in
    flight, the batch being handed over and the one the caller holds."""
    return workers * prefetch_factor + HANDOVER_SLOTS


def batch_bytes(batch_size: int, image_size: int, dtype: torch.dtype) -> int:
    """The bytes of a batch of ``batch_size`` RGB images of ``image_size`` px, of ``dtype``."""
    return batch_size * 3 * image_size * image_size * dtype.itemsize


class BatchRing:
    """``slots`` batches of ``batch_size`` images (``dtype``) in shared memory, each claimed for a request
    only when no request and no caller's tensor uses it."""

    def __init__(
        self, slots: int, *, batch_size: int, image_size: int, memory_format: torch.memory_format, dtype: torch.dtype = torch.uint8
    ) -> None:
        self.batch_size = batch_size
        self.image_size = image_size  # the largest resolution a slot holds
        self.memory_format = memory_format
        shape = (batch_size, 3, image_size, image_size)
        size = slots * batch_bytes(batch_size, image_size, dtype)
        with allocation_lock():  # ranks starting together check and allocate one after the other
            check_shared_memory(size, slots)
            try:
                self.slots = [torch.zeros(shape, dtype=dtype).contiguous(memory_format=memory_format).share_memory_() for _ in range(slots)]
            except RuntimeError as e:  # something other than a ring took the room after the check
                raise shared_memory_error(size, slots, f"{SHARED_MEMORY_DIR} ran out ({str(e).splitlines()[0]})") from None
        self._storages = [slot.untyped_storage() for slot in self.slots]  # the Python objects torch returns for them
        self._unused = storage_use_count(self.slots[0])  # the ring's own references to a slot's memory
        self._unused_storage_refs = sys.getrefcount(self._storages[0])  # and to its storage object
        self._in_flight: set[int] = set()  # slots claimed by a request whose batch has not come back
        self._next = 0  # where the search for a free slot starts: slots are used in turn

    @classmethod
    def for_dataloader(
        cls,
        workers: int,
        prefetch_factor: int,
        *,
        batch_size: int,
        image_size: int,
        memory_format: torch.memory_format,
        dtype: torch.dtype = torch.uint8,
    ) -> BatchRing:
        """The ring a DataLoader with these ``workers`` and ``prefetch_factor`` needs (``ring_slots``)."""
        return cls(
            ring_slots(workers, prefetch_factor), batch_size=batch_size, image_size=image_size, memory_format=memory_format, dtype=dtype
        )

    def claim(self) -> int | None:
        """A free slot for the next request (marked in flight); None when every slot is in flight or held."""
        count = len(self.slots)
        for step in range(count):
            slot = (self._next + step) % count
            if slot not in self._in_flight and not self._held(slot):
                self._in_flight.add(slot)
                self._next = (slot + 1) % count
                return slot
        return None

    def _held(self, slot: int) -> bool:
        """Whether anything outside the ring holds ``slot``: a tensor or array on it, or its storage object."""
        return storage_use_count(self.slots[slot]) != self._unused or sys.getrefcount(self._storages[slot]) != self._unused_storage_refs

    def receive(self, slot: int, count: int, size: int | None = None) -> torch.Tensor:
        """The first ``count`` images of the batch a worker built in ``slot`` at ``size``: a view the caller
        holds (the slot stays taken until every tensor on it is gone)."""
        batch = self.batch(slot, count, size)
        self._in_flight.discard(slot)
        return batch

    def begin_pass(self) -> None:
        """A new pass over the DataLoader: no request of an earlier pass is in flight any more.

        Safe because a persistent-worker DataLoader finishes (and discards) every request of an
        abandoned pass before it takes the first request of the next one.
        """
        self._in_flight.clear()

    def batch(self, slot: int, count: int, size: int | None = None) -> torch.Tensor:
        """``count`` images of ``size`` squared (default: the slot's) at the start of ``slot``, in the ring's
        memory format: a view into shared memory, for the worker to build in."""
        size = self.image_size if size is None else size
        if not 0 < size <= self.image_size or not 0 <= count <= self.batch_size:
            raise ValueError(f"a ring slot holds {self.batch_size} images of {self.image_size} px, not {count} of {size} px")
        image = 3 * size * size
        strides = (image, 1, 3 * size, 3) if self.memory_format == torch.channels_last else (image, size * size, size, 1)
        return self.slots[slot].as_strided((count, 3, size, size), strides)


@contextlib.contextmanager
def allocation_lock(folder: str = SHARED_MEMORY_DIR) -> Iterator[None]:
    """Hold an exclusive lock on ``folder``/.imgpipe-ring.lock: without it, every rank of a node
    checks the room before any has allocated, they all pass, and together they exhaust it
    (the OOM killer then ends a rank without a message).
    No lock where the file cannot be opened."""
    try:
        fd = lock_file(os.path.join(folder, ".imgpipe-ring.lock"), flags=os.O_RDONLY, mode=0o666)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.close(fd)  # type: ignore[arg-type]  (releases the lock)


def check_shared_memory(size: int, slots: int, folder: str = SHARED_MEMORY_DIR, available: int | None = None) -> None:
    """Refuse a ring larger than the free space of ``folder`` (a tmpfs) or than the memory available
    (tmpfs pages are memory): torch would fail to allocate it, or the kernel's OOM killer would
    end the process while ``share_memory_`` writes it. ``available``: the memory to assume (bytes), else what psutil says."""
    try:
        stats = os.statvfs(folder)
    except OSError:  # no such tmpfs here (not Linux): nothing to check
        return
    free = stats.f_bavail * stats.f_frsize
    if size > free:
        raise shared_memory_error(size, slots, f"{folder} has {free / 2**20:.0f} MiB free")
    check_memory(size, f"{slots} shared-memory batches", "batch_size, workers or prefetch_factor", available)


def check_memory(size: int, what: str, lower: str, available: int | None = None) -> None:
    """Refuse ``what`` (``size`` bytes) larger than the memory available: torch's allocator would fail
    with a traceback, or the OOM killer end the process. ``lower``: the options that make it smaller."""
    memory = available_memory() if available is None else available
    if memory is not None and size > memory:
        raise ConfigError(
            f"the torch loader's {what} need {size / 2**20:.0f} MiB but only {memory / 2**20:.0f} MiB of memory is available; lower {lower}"
        )


def shared_memory_error(size: int, slots: int, why: str) -> ConfigError:
    """The one-line error for a ring that does not fit in shared memory (``why``: what the tmpfs said)."""
    return ConfigError(
        f"the torch loader's {slots} shared-memory batches need {size / 2**20:.0f} MiB but {why}; "
        "enlarge it (docker run --shm-size=...) or lower batch_size, workers or prefetch_factor"
    )
