"""A real S3-API server for the tests and benchmarks, and a proxy that adds faults in front of it.

``S3Server``: ``benchmarks/_s3_server.py``'s server (moto's server mode with objects kept in
memory, a subprocess on 127.0.0.1 at a free port that exits by itself after ``lifetime_s`` or
when the process that started it dies), with what the tests do to it: upload a folder, put and
get an object, require credentials, give the AWS variables that reach it.

``FaultProxy``: an HTTP proxy on 127.0.0.1, served by threads of this process, that forwards
every request to the server, after ``latency_s``, and answers chosen GETs with a fault instead:
a 503 ``SlowDown``, a body cut short, a reset connection or a flipped byte (``FAULTS``), or a
response that stalls (``STALLS``: the headers and half the body, then nothing; or nothing at
all), its connection held open until the proxy stops. It counts what it serves, can send each
body at most ``bytes_per_s`` (a slow link), and can hold chosen GETs until the test lets them go.

``NoCredentials``: an HTTP server on 127.0.0.1 standing in for an instance's credential service
(GCE's metadata server, Azure's managed identity endpoint) on a machine that has no identity: it
answers every request 404 and keeps the paths asked.

Standard library, boto3 and moto only: ``benchmarks/`` imports this module too
(``sys.path.insert(0, "tests/remote")``).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

ACCESS_KEY, SECRET_KEY, REGION = "imgpipe-test-key", "imgpipe-test-secret", "us-east-1"
FAULTS = ("slowdown", "truncate", "reset", "corrupt")
STALLS = ("stall", "hang")  # "stall": headers and half the body, then silence; "hang": the request read, never answered
SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>'
)


def _bench_server() -> Any:
    """``benchmarks/_s3_server.py``, loaded by its path (benchmarks/ is not a package)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "_s3_server.py"
    spec = importlib.util.spec_from_file_location("_s3_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now (an endpoint that refuses connections)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """The server in a subprocess; ``start()`` / ``stop()`` or a ``with`` block. ``latency_s`` is added to every request."""

    def __init__(self, *, lifetime_s: float = 900.0, latency_s: float = 0.0) -> None:
        self.lifetime_s = lifetime_s
        self.latency_s = latency_s
        self._running: Any = None

    @property
    def endpoint(self) -> str:
        return self._running.url

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def start(self) -> S3Server:
        self._running = _bench_server().start(latency_s=self.latency_s, lifetime_s=self.lifetime_s)
        return self

    def stop(self) -> None:
        if self._running is not None:
            self._running.stop()

    def counts(self) -> dict[str, int]:
        """The requests the server answered so far: ``requests``, per method, ``range_GET``, ``bytes_out``."""
        return self._running.counts()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The AWS variables a client needs to reach this server (or ``endpoint``, e.g. a proxy in front)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, service: str = "s3", **keys: str) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=keys.get("key", ACCESS_KEY),
            aws_secret_access_key=keys.get("secret", SECRET_KEY),
        )

    def upload(self, folder: str | os.PathLike, bucket: str, prefix: str, *, public: bool = False) -> str:
        """Put every file of ``folder`` (not its subfolders) under ``s3://bucket/prefix/``; return that URL."""
        s3 = self.client()
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
            s3.create_bucket(Bucket=bucket)
        extra = {"ACL": "public-read"} if public else {}
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.name}", Body=path.read_bytes(), **extra)
        return f"s3://{bucket}/{prefix}"

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    @contextlib.contextmanager
    def auth_required(self) -> Iterator[tuple[str, str]]:
        """Make the server check credentials (moto skips that by default); yields a key pair it accepts."""
        iam = self.client("iam")
        user = f"imgpipe-{time.monotonic_ns()}"
        iam.create_user(UserName=user)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        self._reset_auth("0")
        try:
            yield key["AccessKeyId"], key["SecretAccessKey"]
        finally:
            self._reset_auth("inf")

    def _reset_auth(self, count: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth", data=count.encode(), method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            reply.read()


@dataclass
class Counts:
    """What a FaultProxy has served."""

    requests: int = 0
    gets: int = 0
    matching_gets: int = 0
    bytes_out: int = 0
    held: int = 0  # GETs held by ``FaultProxy.hold``
    bodies: dict[str, list[int]] = field(default_factory=dict)  # path -> the size of each body sent for it (status 200 or 206)
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULTS + STALLS, 0))


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream_port``; see the module docstring.

    ``inject(fault, every=N)`` answers every N-th GET whose path contains ``match`` (default
    ``.rec``: record reads) with ``fault``, at most ``limit`` times; ``inject(None)`` stops.
    """

    def __init__(self, upstream_port: int, *, latency_s: float = 0.0, bytes_per_s: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.latency_s = latency_s
        self.bytes_per_s = bytes_per_s  # 0: as fast as it goes
        self.counts = Counts()
        self._fault: str | None = None
        self._every = 1
        self._limit: int | None = None
        self._match = ".rec"
        self._gate: tuple[str, threading.Event] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # releases the stalled responses
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def inject(self, fault: str | None, *, every: int = 1, limit: int | None = None, match: str = ".rec") -> None:
        if fault is not None and fault not in FAULTS + STALLS:
            raise ValueError(f"fault must be one of {FAULTS + STALLS} or None, got {fault!r}")
        with self._lock:
            self._fault, self._every, self._limit, self._match = fault, every, limit, match

    def hold(self, match: str = ".rec") -> threading.Event:
        """Hold every GET whose path contains ``match`` (counted in ``counts.held``) until the event returned is set."""
        gate = threading.Event()
        with self._lock:
            self._gate = (match, gate)
        return gate

    def _choose(self, method: str, path: str) -> str | None:
        """Count the request; the fault to answer it with, or None."""
        with self._lock:
            self.counts.requests += 1
            if method != "GET":
                return None
            self.counts.gets += 1
            if self._match not in path:
                return None
            self.counts.matching_gets += 1
            if self._fault is None or self.counts.matching_gets % self._every:
                return None
            if self._limit is not None and sum(self.counts.faults.values()) >= self._limit:
                return None
            self.counts.faults[self._fault] += 1
            return self._fault


class NoCredentials:
    """A credential service with no credentials to give; see the module docstring. A ``with`` block serves it."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.paths.append(self.path)
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> NoCredentials:
        threading.Thread(target=self._server.serve_forever, name="no-credentials", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # socketserver's 5 drops the connections of a loader's concurrent requests

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that went away is no error of the proxy
            super().handle_error(request, client_address)


_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def _forward(self) -> None:
        try:
            self._serve()
        except (BrokenPipeError, ConnectionResetError):  # the client went away (a loader closed mid-request)
            self.close_connection = True

    def _serve(self) -> None:
        owner = self.owner
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = owner._choose(self.command, self.path)
        gate = owner._gate
        if gate is not None and self.command == "GET" and gate[0] in self.path and not gate[1].is_set():
            with owner._lock:
                owner.counts.held += 1
            gate[1].wait(120)
        if owner.latency_s:
            time.sleep(owner.latency_s)  # elapsed time is what is tested: a link's latency
        if fault == "slowdown":
            self._reply(503, [("Content-Type", "application/xml")], SLOWDOWN_BODY)
            return
        if fault == "hang":
            self._hold()
            return
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        status, headers, data = self._upstream(body)
        if fault == "corrupt" and data:  # a byte flipped where the request's number says: damage in transit differs every time
            at = (owner.counts.matching_gets * 7919) % len(data)
            data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
        if fault in ("truncate", "stall") and len(data) > 1:
            self.send_response(status)  # the whole body announced, half of it sent
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            if fault == "stall":
                self._hold()
                return
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._reply(status, headers, data)

    def _hold(self) -> None:
        """Send nothing more until the proxy stops, then close the connection."""
        self.owner._stopping.wait()
        self.close_connection = True

    def _upstream(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.owner.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            connection.request(self.command, self.path, body=body or None, headers=headers)
            reply = connection.getresponse()
            data = reply.read()
            dropped = _HOP_HEADERS | ({"content-length"} if self.command != "HEAD" else set())  # a HEAD keeps the object's length
            return reply.status, [(k, v) for k, v in reply.getheaders() if k.lower() not in dropped], data
        except OSError:  # the server is down: the client sees a reset, as it would without the proxy
            self.close_connection = True
            return 502, [], b""
        finally:
            connection.close()

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self._write(data)
            with self.owner._lock:
                self.owner.counts.bytes_out += len(data)
                if status in (200, 206):
                    self.owner.counts.bodies.setdefault(self.path.split("?")[0], []).append(len(data))

    def _write(self, data: bytes) -> None:
        """The body, at most ``bytes_per_s`` when the proxy has that limit (a slow link)."""
        rate = self.owner.bytes_per_s
        if not rate:
            self.wfile.write(data)
            return
        piece = max(1, int(rate) // 100)
        for at in range(0, len(data), piece):
            self.wfile.write(data[at : at + piece])
            self.wfile.flush()
            time.sleep(piece / rate)  # elapsed time is what is tested: a link's bandwidth
