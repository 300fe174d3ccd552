"""A thread that sees each signal as it arrives, even while the main thread is stuck in a call, and acts at a deadline.

``signal.set_wakeup_fd`` has the C-level handler write each signal's number to a pipe the moment it
arrives, whatever the main thread is doing (a Python handler runs only once that thread is back in
Python code); a daemon thread reads it and calls ``expire`` once the deadline it was given passes.
The process that owns it (the ``imgpipe`` command, a rank imgpipe's launcher started) installs one.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Callable

_forks_watched = False


class SignalWatch:
    """Calls ``on_signal(signum)`` from its thread for each signal with a Python handler (0: ``wake()`` was called),
    and ``expire()`` at the deadline."""

    def __init__(self, on_signal: Callable[[int], None], expire: Callable[[], None]) -> None:
        self._on_signal = on_signal
        self._expire = expire
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)

    def install(self) -> SignalWatch:
        """Take the wakeup fd (from the main thread) and start watching."""
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        _reset_in_forked_children()
        threading.Thread(target=self._watch, name="imgpipe-signal-watch", daemon=True).start()
        return self

    def expire_by(self, deadline: float) -> None:
        """Call ``expire`` at ``deadline`` (``time.monotonic()``) at the latest."""
        with self._lock:
            self._deadline = min(self._deadline or float("inf"), deadline)
        self.wake()

    def wake(self) -> None:
        try:
            os.write(self._write_fd, b"\0")
        except OSError:  # the pipe is full: the thread has bytes to read anyway
            pass

    def _watch(self) -> None:
        while True:
            with self._lock:
                deadline = self._deadline
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if select.select([self._read_fd], [], [], timeout)[0]:
                for signum in os.read(self._read_fd, 4096):
                    self._on_signal(signum)
            elif deadline is not None:
                with self._lock:
                    self._deadline = None
                self._expire()


def _reset_in_forked_children() -> None:
    """A forked child's signals must not wake its parent's thread: it gets no wakeup fd."""
    global _forks_watched
    if not _forks_watched:
        os.register_at_fork(after_in_child=_no_wakeup_fd)
        _forks_watched = True


def _no_wakeup_fd() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from a thread other than the main one: not the main thread there either
        pass
