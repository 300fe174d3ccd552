"""How every command stops: within a grace of SIGTERM, SIGINT or SIGHUP, with one line and exit code 143, 130 or 129,
whatever its threads and processes are doing.

The signal unwinds the main thread as Ctrl-C does (``Stopped`` for SIGTERM), so the command stops its
workers and says so. Failing that, a thread woken by the signal itself
(:class:`~imgpipe._sys.signalwatch.SignalWatch`) prints the line after ``STOP_GRACE_S``, kills every
process the command started, and theirs, and ends the process; so does a second signal, at once (within
``EXIT_GRACE_S`` for a command that handles the signals itself), and one that arrives while the process
forks (an exception raised in a fork hook is only printed, and lost).
A command that handles the signals itself (``imgpipe train``: checkpoint and stop) says how long it
needs (:func:`command_stops_within`). The process ends right after its exit handlers, never in the
interpreter's teardown, where a signal would kill it without a word.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

from imgpipe._sys.signalwatch import SignalWatch
from imgpipe.errors import Stopped

STOP_GRACE_S = 5.0  # from the first signal: the command stops its workers and prints its line
EXIT_GRACE_S = 2.0  # from a failing or stopped command's line: what Python joins at exit ends
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: the terminal closed (left ignored under nohup)
_command_grace_s: float | None = None  # set by a command that handles SIGTERM/SIGINT itself


def command_stops_within(grace_s: float) -> None:
    """The running command handles SIGTERM and SIGINT itself and ends within ``grace_s`` of the first; past
    that, or ``EXIT_GRACE_S`` after a second signal, the process is ended all the same."""
    global _command_grace_s
    _command_grace_s = grace_s


class StopGuard:
    """Installed by the ``imgpipe`` entry point for the life of the process (a library call never installs it)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._signum: int | None = None  # the first stop signal
        self._raised = False  # the main thread has unwound on a signal
        self._forking = False  # in a fork hook, a raised exception is only printed: a signal then ends the process
        self._command_signals = 0  # stop signals the command handled itself
        self._code: int | None = None  # the exit code, once the command has ended and printed its line
        self._kill_descendants: Callable[[], None] = lambda: None  # until install imports procs: a stop while it imports
        self._exit_now: Callable[[int], None] = os._exit  # ends a process that has started nothing and printed only its line
        self.watch = SignalWatch(self._watched, lambda: self._end(None))

    def install(self) -> StopGuard:
        self.watch.install()
        for signum in STOP_SIGNALS:
            if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:
                signal.signal(signum, self._on_signal)
        os.register_at_fork(before=self._fork_begins, after_in_parent=self._fork_ends)
        self._unraisable, sys.unraisablehook = sys.unraisablehook, self._on_unraisable
        atexit.register(self._at_exit)  # registered before multiprocessing's (imported below), so it runs after it
        import psutil  # noqa: F401  (imported now: _end may run in the exit handlers, where an import can fail)

        from imgpipe._sys.procs import exit_now, kill_descendants  # here, not above: procs imports multiprocessing

        self._kill_descendants, self._exit_now = kill_descendants, exit_now
        return self

    def finish(self, code: int) -> None:
        """The command ended with ``code`` and printed its line; a failing one's threads get ``EXIT_GRACE_S`` to end."""
        with self._lock:
            self._code = code
        if code != 0:
            self.watch.expire_by(time.monotonic() + EXIT_GRACE_S)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """The first signal unwinds the main thread; a second one, one during a fork, or one after the command ended,
        ends the process."""
        if os.getpid() == self._pid:  # a forked worker raises as it always has: its parent stops it
            with self._lock:
                later, self._raised = self._raised or self._code is not None, True
            if later or self._forking:
                self._end(signum)
            self._arm(signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)

    def _arm(self, signum: int, grace_s: float = STOP_GRACE_S) -> None:
        """The process ends ``grace_s`` after the first stop signal at the latest."""
        with self._lock:
            if self._signum is None:
                self._signum = signum
        self.watch.expire_by(time.monotonic() + grace_s)

    def _watched(self, signum: int) -> None:
        """From the watch thread, for each signal as it arrives (0: woken)."""
        if signum not in STOP_SIGNALS:
            return
        if signal.getsignal(signum) == self._on_signal:  # armed here too: the main thread may be stuck in a call
            self._arm(signum)
            return
        self._command_signals += 1  # one the command handles: a second one leaves it EXIT_GRACE_S to end by itself
        grace_s = EXIT_GRACE_S if self._command_signals > 1 else STOP_GRACE_S if _command_grace_s is None else _command_grace_s
        self._arm(signum, grace_s)

    def _fork_begins(self) -> None:
        self._forking = True

    def _fork_ends(self) -> None:
        self._forking = False

    def _on_unraisable(self, unraisable: Any) -> None:
        """A stop raised where Python can only print it (a fork hook registered after ours, a ``__del__``) ends the
        process (in a forked worker, it is dropped: its parent stops it)."""
        if not issubclass(unraisable.exc_type, (Stopped, KeyboardInterrupt)):
            self._unraisable(unraisable)
        elif os.getpid() == self._pid:
            self._end(None)

    def _end(self, signum: int | None) -> None:
        """Kill every process this one started, and theirs, and exit now: 128 + the first stop signal (``signum`` if
        none came before), saying so unless the command's own line did; else with the command's exit code."""
        with self._lock:
            stop, code = self._signum or signum, self._code
        if stop is not None:
            if code != 128 + stop:
                _write_line(f"imgpipe: stopped by {signal.Signals(stop).name}")
            code = 128 + stop
        self._kill_descendants()
        self._exit_now(code or 0)

    def _at_exit(self) -> None:
        """The last exit handler: end the process now, without the interpreter's teardown (not in a forked child)."""
        if os.getpid() == self._pid:
            logging.shutdown()  # its own exit handler, registered before this one, would come after
            self._exit_now(self._code or 0)


def _write_line(line: str) -> None:
    try:
        sys.stderr.flush()
        os.write(sys.stderr.fileno(), f"{line}\n".encode())
    except (OSError, ValueError):
        pass
