"""A helper process that makes a process's obstore requests for it, so the process stays forkable.

A process that opens a URL never calls obstore itself (``store_client`` says why): it starts this helper,
a fresh interpreter (never a fork), and asks it over a socket. The helper runs a ``DirectClient``,
serves requests concurrently, answered by number, runs the background jobs a caller starts by name
(``start("module:function", ...)``: a node cache's fill), and exits when the socket closes or its parent
dies. Started as ``python -m imgpipe.storage.store_helper FD PARENT_PID BUDGET_S``.
"""

from __future__ import annotations

import importlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from imgpipe.storage.store_client import TRANSIENT, DirectClient, StoreError, config_fingerprint, no_answer

_helpers: dict[tuple[Any, ...], weakref.ReferenceType[HelperClient]] = {}  # one per (process, store environment, budget)
_registry_lock = threading.Lock()


class HelperClient:
    """The ``DirectClient`` methods, served by a helper process; one per process, shared by its sources."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._pid = os.getpid()
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])  # the helper imports this very imgpipe
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "imgpipe.storage.store_helper", str(theirs.fileno()), str(os.getpid()), repr(budget_s)],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        self._socket = ours
        self._conn = Connection(os.dup(ours.fileno()))
        self._numbers = itertools.count()
        self._waiting: dict[int, Future] = {}
        self._send_lock = threading.Lock()
        threading.Thread(target=self._receive, name="imgpipe-store-helper", daemon=True).start()
        weakref.finalize(self, _stop, self._pid, self._socket, self._conn, self._process)

    @classmethod
    def shared(cls, budget_s: float) -> HelperClient:
        """This process's helper for the current store environment, started on first use."""
        key = (os.getpid(), config_fingerprint(), budget_s)
        with _registry_lock:
            helper = _helpers.get(key, lambda: None)()
            if helper is None or helper._process.poll() is not None:
                helper = cls(budget_s)
                _helpers[key] = weakref.ref(helper)
        return helper

    def get(self, url: str, names: list[str], timeout: float) -> list[bytes | StoreError]:
        return self._ask(timeout, "get", url, list(names), timeout)

    def head(self, url: str, name: str, timeout: float) -> int | StoreError:
        return self._ask(timeout, "head", url, name, timeout)

    def get_ranges(self, url: str, files: list[tuple[str, list[int], list[int]]], timeout: float) -> list[list[Any] | StoreError]:
        return self._ask(timeout, "get_ranges", url, files, timeout)

    def download(self, url: str, name: str, dest: str, timeout: float) -> int | StoreError:
        return self._ask(timeout, "download", url, name, str(dest), timeout)

    def list_sizes(self, url: str, timeout: float) -> dict[str, int] | StoreError:
        return self._ask(timeout, "list_sizes", url, timeout)

    def download_range(self, url: str, name: str, dest: str, start: int, end: int, timeout: float) -> int | StoreError:
        return self._ask(timeout, "download_range", url, name, str(dest), start, end, timeout)

    def put(self, url: str, name: str, data: bytes, timeout: float) -> int | StoreError:
        return self._ask(timeout, "put", url, name, bytes(data), timeout)

    def put_file(self, url: str, name: str, path: str, timeout: float) -> tuple[int, str] | StoreError:
        return self._ask(timeout, "put_file", url, name, str(path), timeout)

    def delete(self, url: str, names: list[str], timeout: float) -> None | StoreError:
        return self._ask(timeout, "delete", url, list(names), timeout)

    def request_stats(self, timeout: float) -> dict[str, float] | StoreError:
        return self._ask(timeout, "request_stats", timeout)

    def start(self, target: str, *args: Any) -> None:
        """Have the helper run ``target`` ("module:function", called as ``function(client, *args)``) in the
        background, with its own store client; no answer is awaited."""
        try:
            with self._send_lock:
                self._conn.send((next(self._numbers), "start", (target, *args)))
        except OSError:  # the helper is gone: the caller does without (a cache's loaders fetch what they miss themselves)
            pass

    def _ask(self, timeout: float, op: str, *args: Any) -> Any:
        number = next(self._numbers)
        future: Future = Future()
        self._waiting[number] = future
        try:
            with self._send_lock:
                self._conn.send((number, op, args))
        except OSError:
            self._waiting.pop(number, None)
            return _gone(op, args)
        try:
            return future.result(timeout=timeout + 1.0)  # the helper keeps to ``timeout`` itself
        except TimeoutError:
            return _all(op, args, no_answer(timeout))
        except ConnectionError:
            return _gone(op, args)
        finally:
            self._waiting.pop(number, None)

    def _receive(self) -> None:
        while True:
            try:
                number, result = self._conn.recv()
            except (EOFError, OSError):
                break
            future = self._waiting.get(number)
            if future is not None and not future.done():
                future.set_result(result)
        for future in list(self._waiting.values()):  # the helper died: every open request fails
            if not future.done():
                future.set_exception(ConnectionError("the store helper process exited"))


def _gone(op: str, args: tuple[Any, ...]) -> Any:
    return _all(op, args, StoreError(TRANSIENT, "the store helper process exited"))


def _all(op: str, args: tuple[Any, ...], error: StoreError) -> Any:
    """``error`` in the shape ``op`` answers: one per file for the batch calls."""
    return [error] * len(args[1]) if op in ("get", "get_ranges") else error


def _stop(pid: int, sock: socket.socket, conn: Connection, process: subprocess.Popen) -> None:
    """Close the helper of process ``pid`` (a forked child leaves its parent's helper alone)."""
    if os.getpid() != pid:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)  # EOF for the helper, and for our receiver thread blocked in recv (a close alone wakes neither)
    except OSError:
        pass
    sock.close()
    conn.close()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve(conn: Connection, budget_s: float) -> None:
    """Answer requests until the socket closes."""
    from imgpipe._sys.threads import DaemonPool

    client = DirectClient(budget_s)
    workers = DaemonPool(16, "imgpipe-store-request")
    lock = threading.Lock()

    def answer(number: int, op: str, args: tuple[Any, ...]) -> None:
        if op == "start":
            module, _, function = args[0].partition(":")
            result = getattr(importlib.import_module(module), function)(client, *args[1:])
        else:
            result = _plain(getattr(client, op)(*args))
        with lock:
            try:
                conn.send((number, result))
            except OSError:  # the parent is gone
                pass

    while True:
        try:
            number, op, args = conn.recv()
        except (EOFError, OSError):
            return
        workers.submit(answer, number, op, args)


def _plain(result: Any) -> Any:
    """obstore's buffers as bytes, so the answer pickles."""
    if isinstance(result, list):
        return [_plain(item) for item in result]
    if isinstance(result, (StoreError, bytes, int, float, str, tuple, dict)) or result is None:
        return result
    return bytes(result)


def main(argv: list[str]) -> None:
    from imgpipe._sys.procs import die_with_parent

    fd, parent, budget = int(argv[0]), int(argv[1]), float(argv[2])
    die_with_parent(parent)
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # a Ctrl-C reaches the whole process group: the parent handles it, and this helper ends with it
    serve(Connection(fd), budget)


if __name__ == "__main__":
    main(sys.argv[1:])
