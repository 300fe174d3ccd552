"""A local S3-API server for the remote-storage benchmarks: moto's server with objects kept in memory,
a fixed latency added to every request, and a count of the requests it answered.

Stock moto keeps an object over 5 MB in a temporary file and answers a range GET by reading the
whole object, so a client reading records by range off a 64 MB shard measures moto's copies, not
its own requests. Here every object's value is one ``bytes`` object: a GET hands it over without a
copy and a range GET copies its range only. The latency (``time.sleep`` in the handler thread,
before moto sees the request) stands in for a remote store's time to first byte; concurrent
requests wait concurrently, as they would on a network.

    server = start(latency_s=0.02)         # a child process; server.url is http://127.0.0.1:PORT
    server.counts()                        # {"requests": n, "GET": n, "range_GET": n, "bytes_out": n, ...}
    server.stop()

``fetch_counts(url)`` reads the counts from any process (the peers' venv has no moto): this module
imports only the standard library until it serves. ``python _s3_server.py --port 9000`` serves in
the foreground.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from typing import Any, Callable, Iterable, Iterator

COUNTS_PATH = "/__bench__/counts"  # never an S3 path: bucket names cannot start with "_"
DEFAULT_LIFETIME_S = 3600.0


class InMemoryValue:
    """What moto's ``FakeKey`` keeps its value in (instead of a ``SpooledTemporaryFile``): one bytes
    object, so a whole read returns it without a copy and a range GET costs only its range."""

    def __init__(self, max_size: int = 0) -> None:
        self._data, self._pos = b"", 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else (self._pos + pos if whence == 1 else len(self._data) + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        self._data = self._data[: self._pos if size is None else size]
        return len(self._data)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        data = bytes(data)
        if self._pos == len(self._data):
            self._data = data if not self._data else self._data + data
        else:
            self._data = self._data[: self._pos] + data + self._data[self._pos + len(data) :]
        self._pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size is None or size < 0 else min(len(self._data), self._pos + size)
        out = self._data if (self._pos, end) == (0, len(self._data)) else self._data[self._pos : end]
        self._pos = end
        return out

    def close(self) -> None:
        self._data, self._pos = b"", 0


def keep_values_in_memory() -> None:
    """Make moto's S3 keys (created from now on, in this process) keep their values in ``InMemoryValue``."""
    from types import SimpleNamespace

    import moto.s3.models

    moto.s3.models.tempfile = SimpleNamespace(SpooledTemporaryFile=InMemoryValue)  # the module's only use of tempfile


class LatencyAndCounts:
    """WSGI middleware in front of moto: sleep ``latency_s``, count the request and the bytes it
    sent and received; ``GET COUNTS_PATH`` answers the counts as JSON, at once and uncounted."""

    def __init__(self, app: Callable[..., Iterable[bytes]], latency_s: float) -> None:
        self.app, self.latency_s = app, latency_s
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == COUNTS_PATH:
            with self.lock:
                body = json.dumps(dict(self.counts)).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        time.sleep(self.latency_s)
        method = environ.get("REQUEST_METHOD", "")
        with self.lock:
            self.counts["requests"] += 1
            self.counts[method] += 1
            if method == "GET" and environ.get("HTTP_RANGE"):
                self.counts["range_GET"] += 1
            self.counts["bytes_in"] += int(environ.get("CONTENT_LENGTH") or 0)
        return self._counted(self.app(environ, start_response))

    def _counted(self, body: Iterable[bytes]) -> Iterator[bytes]:
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            getattr(body, "close", lambda: None)()
            with self.lock:
                self.counts["bytes_out"] += sent


def serve(host: str, port: int, latency_s: float, lifetime_s: float, announce: Callable[[str], None]) -> None:
    """Serve moto (values in memory) behind ``LatencyAndCounts`` on host:port (0: any free port) for
    at most ``lifetime_s``; ``announce`` gets the URL once it accepts connections."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    keep_values_in_memory()
    app = LatencyAndCounts(DomainDispatcherApplication(create_backend_app), latency_s)
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    timer = threading.Timer(lifetime_s, server.shutdown)
    timer.daemon = True
    timer.start()
    bound_host, bound_port = server.server_address[:2]
    announce(f"http://{bound_host}:{bound_port}")
    server.serve_forever()


def fetch_counts(url: str, timeout_s: float = 10.0) -> dict[str, int]:
    """The server's counts so far (requests, per method, range_GET, bytes_out, bytes_in)."""
    with urllib.request.urlopen(url + COUNTS_PATH, timeout=timeout_s) as response:
        return Counter(json.loads(response.read()))


class S3Server:
    """A running server in a child process: ``url``, ``counts()``, ``stop()``; a context manager."""

    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process, self.url = process, url

    def counts(self) -> dict[str, int]:
        return fetch_counts(self.url)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    host: str = "127.0.0.1", port: int = 0, latency_s: float = 0.02, lifetime_s: float = DEFAULT_LIFETIME_S, python: str = sys.executable
) -> S3Server:
    """Start the server in a child process (``python`` must have moto[server]); it dies with this
    process and after ``lifetime_s`` at the latest."""
    command = [python, os.path.abspath(__file__), "--host", host, "--port", str(port), "--latency-s", str(latency_s),
               "--lifetime-s", str(lifetime_s), "--parent-pid", str(os.getpid())]  # fmt: skip
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # imgpipe of this checkout, for die_with_parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline().strip()  # the URL once it listens, or "" if it died
    if not line.startswith("http://"):
        process.kill()
        raise RuntimeError(f"the S3 server did not start (exit code {process.wait()})")
    return S3Server(process, line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--latency-s", type=float, default=0.02, help="added before every request")
    p.add_argument("--lifetime-s", type=float, default=DEFAULT_LIFETIME_S, help="stop after this long at most")
    p.add_argument("--parent-pid", type=int, help="die with this process")
    a = p.parse_args(argv)
    if a.parent_pid:
        from imgpipe._sys.procs import die_with_parent

        die_with_parent(a.parent_pid)
    serve(a.host, a.port, a.latency_s, a.lifetime_s, lambda url: print(url, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
