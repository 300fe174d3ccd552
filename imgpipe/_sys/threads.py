"""A pool of daemon threads for blocking I/O calls.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, so one
call stuck in a network retry would hold the exit of a process that has already reported the
error; these threads never keep a process alive.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

R = TypeVar("R")


class DaemonPool:
    """Up to ``threads`` daemon threads, started as work arrives, running submitted calls in order."""

    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._started = 0
        self._waiting = 0  # threads blocked waiting for work
        self._queued = 0  # calls submitted and not yet taken
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` in a pool thread; its Future holds the result or the exception."""
        future: Future[R] = Future()
        with self._lock:
            self._queued += 1
            if self._queued > self._waiting and self._started < self.threads:
                self._started += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self._started}", daemon=True).start()
        self._queue.put((future, fn, args))
        return future

    def close(self) -> None:
        """Let the threads end once the calls submitted so far have run; submit nothing after."""
        with self._lock:
            started, self._started = self._started, self.threads
        for _ in range(started):
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            item = self._queue.get()
            with self._lock:
                self._waiting -= 1
                if item is not None:
                    self._queued -= 1
            if item is None:
                return
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # handed to the caller through the Future
                    future.set_exception(e)
