"""The private torch APIs imgpipe wraps still exist and still do what the wrapper relies on.

A torch upgrade that renames or drops one fails here, by name, instead of leaving workers behind.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from imgpipe._sys.torch_private import shutdown_persistent_workers, storage_use_count


def test_dataloader_keeps_its_persistent_iterator_and_it_can_shut_its_workers_down() -> None:
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=1, persistent_workers=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert hasattr(loader, "_iterator"), "torch.utils.data.DataLoader no longer has _iterator"
    iterator = loader._iterator
    assert iterator is not None, "DataLoader._iterator no longer holds the persistent iterator"
    assert callable(getattr(iterator, "_shutdown_workers", None)), "the DataLoader iterator lost _shutdown_workers"
    workers = list(iterator._workers)
    assert workers and all(w.is_alive() for w in workers)
    shutdown_persistent_workers(loader)
    assert loader._iterator is None and not any(w.is_alive() for w in workers)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]  # a later epoch starts new workers
    shutdown_persistent_workers(loader)
    shutdown_persistent_workers(loader)  # nothing running: a no-op
    assert torch.utils.data.get_worker_info() is None


def test_storage_use_count_sees_every_tensor_view_and_array_on_a_storage() -> None:
    base = torch.zeros(4, 3).share_memory_()
    unused = storage_use_count(base)
    view = base[1:3]
    row = view[0]
    del view
    assert storage_use_count(base) == unused + 1  # the view of a view holds it
    array = row.numpy()
    del row
    assert storage_use_count(base) == unused + 1  # so does a numpy array on it
    del array
    assert storage_use_count(base) == unused
    copy = base.clone()
    assert storage_use_count(base) == unused and storage_use_count(copy) == unused  # a copy holds its own
