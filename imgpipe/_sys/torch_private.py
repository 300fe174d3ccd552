"""Every private torch and torchvision API imgpipe relies on, each behind one wrapper; nothing else in imgpipe names one.

``PRIVATE_NAMES`` lists them. ``tests/_sys/test_torch_private.py`` checks each against the installed
torch, so an upgrade that renames one fails there, by name, and finds any private name used elsewhere.
"""

from __future__ import annotations

from typing import Any

PRIVATE_NAMES = (
    "torch.utils.data.DataLoader._iterator",
    "torch.utils.data.dataloader._MultiProcessingDataLoaderIter._shutdown_workers",
    "torch.utils.data.dataloader._MultiProcessingDataLoaderIter._index_queues",
    "torch.utils.data.dataloader._MultiProcessingDataLoaderIter._worker_result_queue",
    "multiprocessing.queues.Queue._thread",
    "torch._C._storage_Use_Count",
    "torch.UntypedStorage._cdata",
    "torch.multiprocessing.reductions.shared_cache",
    "torch._dynamo.maybe_mark_dynamic",
    "torchvision.io.image._has_image_ops",
)


def shutdown_persistent_workers(loader: Any) -> None:
    """Stop a ``torch.utils.data.DataLoader``'s worker processes now.

    With ``persistent_workers=True`` the DataLoader keeps its iterator (and so its workers) in
    the private ``_iterator`` until it is collected; no public API stops them. The iterator's
    ``_shutdown_workers`` is what torch itself calls on collection.
    """
    iterator, loader._iterator = loader._iterator, None
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return
    queues = [*getattr(iterator, "_index_queues", ()), getattr(iterator, "_worker_result_queue", None)]
    shutdown()
    for queue in queues:  # torch closes them without waiting for their feeder threads: wait, so none outlives the call
        feeder = getattr(queue, "_thread", None)  # multiprocessing.Queue's private feeder thread, started on the first put
        if feeder is not None:
            feeder.join(timeout=5)


def storage_use_count(tensor: Any) -> int:
    """How many references hold ``tensor``'s storage: tensors and views on it, numpy arrays and
    DLPack capsules made from them (a storage's Python object alone does not count).

    ``torch._C._storage_Use_Count`` is what torch's own CUDA-graph trees use to see whether the
    caller still holds an output before they reuse its memory.
    """
    import torch

    return int(torch._C._storage_Use_Count(tensor.untyped_storage()._cdata))


def free_dead_shared_storages() -> None:
    """Drop the entries of torch's shared-storage cache (``torch.multiprocessing.reductions.shared_cache``)
    whose storages are gone; torch itself does so only every 128 new entries (docs/measurements.md says why
    the loaders need it sooner). Nothing happens where a torch lacks the cache."""
    from torch.multiprocessing import reductions

    cache = getattr(reductions, "shared_cache", None)
    if cache is None:
        return
    with cache.lock:
        cache.free_dead_references()


def maybe_mark_dynamic(tensor: Any, dim: int) -> None:
    """``torch._dynamo.maybe_mark_dynamic``: ``torch.compile`` treats ``dim`` of ``tensor`` as of any size where
    the graph allows it, instead of compiling a graph per size; torch has no public name for it."""
    import torch._dynamo

    torch._dynamo.maybe_mark_dynamic(tensor, dim)


def torchvision_has_image_ops() -> bool:
    """Whether torchvision's image extension (its ``decode_jpeg``) was built and loaded: the private
    ``torchvision.io.image._has_image_ops``, which torchvision's own decoders check; False without it."""
    try:
        from torchvision.io.image import _has_image_ops
    except ImportError:
        return False
    return bool(_has_image_ops())
