"""The memory bound of the fuzz tests over parsers of untrusted bytes: what Python allocates while a parse runs."""

from __future__ import annotations

import tracemalloc
from typing import Callable


def allocated_by(action: Callable[[], object], allowed: type[BaseException] | tuple[type[BaseException], ...] = ()) -> int:
    """The peak bytes allocated while ``action`` runs (tracemalloc: numpy's and Python's allocations); an
    ``allowed`` error ends it, and its message must be one line. Any other exception fails the caller."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        try:
            action()
        except allowed as e:
            assert "\n" not in str(e), str(e)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
