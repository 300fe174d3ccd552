"""Every private torch API imgpipe relies on, each behind one wrapper.

``tests/_sys/test_torch_private.py`` checks each against the installed torch, so an upgrade
that renames one fails there, loudly, instead of silently leaving worker processes behind.
"""

from __future__ import annotations

from typing import Any


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
