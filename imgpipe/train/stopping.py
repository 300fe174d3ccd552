"""SIGTERM and Ctrl-C inside a rank: a flag the training loop checks, so that it checkpoints and stops at an agreed step.

Within :func:`stop_handlers`, SIGTERM and SIGINT set the flag (:func:`stop_requested`); a second
Ctrl-C raises KeyboardInterrupt, a second SIGTERM changes nothing (a scheduler's and a launcher's may
both reach a rank). Outside the block (a rank still starting) the signal stops the rank at once, and
the launcher reports a stop, not a failure. Ending a run that does not stop in time is the job of the
process's owner: the ``imgpipe`` command, or the rank imgpipe's launcher started (``rank_main``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import Iterator

logger = logging.getLogger(__name__)

_stop_signal: int | None = None


def stop_requested() -> int | None:
    """The signal (SIGTERM/SIGINT) that asked this rank to stop, or None; see :func:`stop_handlers`."""
    return _stop_signal


@contextlib.contextmanager
def stop_handlers() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT set a flag (:func:`stop_requested`) that the training loop checks;
    a second Ctrl-C raises KeyboardInterrupt. The flag starts clear; the previous handlers come back after."""
    global _stop_signal

    def _note(signum: int, _frame: object) -> None:
        global _stop_signal
        if _stop_signal is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
            return  # keep the first
        _stop_signal = signum
        logger.warning("got %s: stopping at the next step, after a checkpoint", signal.Signals(signum).name)

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    _stop_signal = None
    try:
        for signum in previous:
            signal.signal(signum, _note)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        _stop_signal = None
