"""How every command stops: within ``STOP_GRACE_S`` of SIGTERM or SIGINT, with one line and exit code 143
or 130, whatever its threads are doing.

The signal unwinds the main thread as Ctrl-C does (``Stopped`` for SIGTERM), so the command stops its
workers and says so. Failing that, a watchdog thread woken by the signal itself (``signal.set_wakeup_fd``,
written even while the main thread is stuck in a call) prints the line after ``STOP_GRACE_S``, kills the
children and ends the process with ``os._exit`` (``EXIT_GRACE_S`` after a failing or stopped command's own
line). A second signal ends it at once; the trainer's launcher handles the signals itself.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from imgpipe.errors import Stopped

STOP_GRACE_S = 5.0  # from the first signal: the command stops its workers and prints its line
EXIT_GRACE_S = 2.0  # from a failing or stopped command's line: what Python joins at exit ends
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_forks_watched = False


class StopGuard:
    """Installed by the ``imgpipe`` entry point for the life of the process (a library call never installs it)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._signum: int | None = None  # the first stop signal
        self._handled = False  # the main thread has taken a signal
        self._code: int | None = None  # the exit code, once the command has ended and printed its line
        self._deadline: float | None = None
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)

    def install(self) -> "StopGuard":
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        _reset_in_forked_children()
        threading.Thread(target=self._watch, name="imgpipe-stop-watch", daemon=True).start()
        return self

    def finish(self, code: int) -> None:
        """The command ended with ``code`` and printed its line; a failing one's threads get ``EXIT_GRACE_S`` to end."""
        with self._lock:
            self._code = code
            if code != 0:
                self._deadline = min(self._deadline or float("inf"), time.monotonic() + EXIT_GRACE_S)
        self._wake()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """The first signal unwinds the main thread; a second one, or one after the command ended, ends the process."""
        if os.getpid() == self._pid:  # a forked worker raises as it always has: its parent stops it
            with self._lock:
                later, self._handled = self._handled or self._code is not None, True
            if later:
                self._end(signum)
            self._arm(signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)

    def _arm(self, signum: int) -> None:
        """The process ends ``STOP_GRACE_S`` after the first stop signal at the latest."""
        with self._lock:
            if self._signum is None:
                self._signum = signum
                self._deadline = min(self._deadline or float("inf"), time.monotonic() + STOP_GRACE_S)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._write_fd, b"\0")
        except OSError:  # the pipe is full: the watchdog has bytes to read anyway
            pass

    def _watch(self) -> None:
        while True:
            with self._lock:
                deadline = self._deadline
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if select.select([self._read_fd], [], [], timeout)[0]:
                for signum in os.read(self._read_fd, 4096):
                    if signum in STOP_SIGNALS and signal.getsignal(signum) == self._on_signal:  # not one a command handles
                        self._arm(signum)
            elif deadline is not None:
                self._end(None)

    def _end(self, signum: int | None) -> None:
        """Kill the child processes and exit now: 128 + the first stop signal (``signum`` if none came before),
        saying so unless the command's own line did; else with the command's exit code."""
        with self._lock:
            stop, code = self._signum or signum, self._code
        if stop is not None:
            if code != 128 + stop:
                _write_line(f"imgpipe: stopped by {signal.Signals(stop).name}")
            code = 128 + stop
        for child in multiprocessing.active_children():
            child.kill()  # the others (a store helper) die with this process: see _sys.procs.die_with_parent
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code or 0)


def _write_line(line: str) -> None:
    try:
        sys.stderr.flush()
        os.write(sys.stderr.fileno(), f"{line}\n".encode())
    except (OSError, ValueError):
        pass


def _reset_in_forked_children() -> None:
    """A forked worker's signals must not wake this process's watchdog: it gets no wakeup fd."""
    global _forks_watched
    if not _forks_watched:
        os.register_at_fork(after_in_child=_no_wakeup_fd)
        _forks_watched = True


def _no_wakeup_fd() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from a thread other than the main one: not the main thread there either
        pass
