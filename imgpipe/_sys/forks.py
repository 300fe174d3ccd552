"""Per-process state a forked child must not share (descriptors it would share offsets and locks of,
thread pools whose threads it lacks, clients whose runtime does not survive a fork): the owner
registers a reset, and ``os.register_at_fork`` runs it in every child forked while the owner lives.

A spawned child unpickles its own copy instead (the owners' ``__getstate__`` leaves that state out).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable

_resets: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def reset_after_fork(owner: Any, reset: Callable[[Any], None]) -> None:
    """Call ``reset(owner)`` in each child forked from this process from now on, while ``owner`` lives.
    ``reset`` takes the owner as its argument (a plain function, so the registry holds no reference to it)."""
    with _lock:
        _resets[owner] = reset


def _before() -> None:
    _lock.acquire()  # no other thread of the parent is mid-registration when the child is made


def _in_parent() -> None:
    _lock.release()


def _in_child() -> None:
    global _lock
    _lock = threading.Lock()  # the parent's, held by the forking thread, is not this process's
    for owner, reset in list(_resets.items()):
        reset(owner)


os.register_at_fork(before=_before, after_in_parent=_in_parent, after_in_child=_in_child)
