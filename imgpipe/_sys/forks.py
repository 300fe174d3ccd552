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


def _reset_all() -> None:
    for owner, reset in list(_resets.items()):
        reset(owner)


# The lock's own methods, not Python functions around them: a signal handler cannot raise between the
# fork and the release (an exception in a fork hook is only printed), which would leave the lock held.
os.register_at_fork(before=_lock.acquire, after_in_parent=_lock.release, after_in_child=_lock.release)
os.register_at_fork(after_in_child=_reset_all)
