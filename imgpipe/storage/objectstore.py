"""A folder at a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``) as a ``ByteSource``, through obstore.

A batch of ranges is grouped by file into spans of at most ``MAX_REQUEST_BYTES``, one ``get_ranges``
per group, the groups concurrently. Every range is checked (its length, and the caller's check); one that
fails, and a transient store error, is fetched again with backoff until ``IMGPIPE_REMOTE_TIMEOUT`` runs
out, while bytes that fail twice alike are what the store holds (docs/remote.md, "Faults"). obstore is
not fork-safe: requests go through ``store_client`` and its helper process (``store_helper``).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from typing import Any, Callable, Sequence

from imgpipe._sys.checksum import crc32
from imgpipe._sys.forks import reset_after_fork
from imgpipe._sys.threads import DaemonPool
from imgpipe.errors import ConfigError, ImgpipeError, RemoteError
from imgpipe.storage.source import ByteRange, ByteSource, RangeCheck, RangeError, url_scheme
from imgpipe.storage.store_client import MISSING, TRANSIENT, DirectClient, StoreError, config_fingerprint, direct_allowed

TIMEOUT_ENV = "IMGPIPE_REMOTE_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
INSTALL_HINT = "pip install 'imgpipe[remote]'"
_BACKOFF_S = 0.1  # the first retry waits up to this long, doubling up to _MAX_BACKOFF_S
_MAX_BACKOFF_S = 2.0
FETCH_THREADS = 8  # batches of ranges one process reads at once: the one it waits for and up to 7 fetched ahead
MAX_REQUEST_BYTES = 2 << 20  # neighbouring ranges are merged into requests of at most this span, fetched in parallel

_direct: dict[tuple[Any, ...], DirectClient] = {}
_direct_lock = threading.Lock()


def retry_seconds(environ: dict[str, str] | None = None) -> float:
    """How long a remote read may keep retrying: ``IMGPIPE_REMOTE_TIMEOUT`` seconds, default 30."""
    raw = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: give the seconds a remote read may retry, e.g. 30")
    return value


def _client_for(owner: int, budget_s: float) -> Any:
    """The process that opened a source asks a helper; its forked children use obstore themselves."""
    if os.getpid() == owner or not direct_allowed():
        from imgpipe.storage.store_helper import HelperClient

        return HelperClient.shared(budget_s)
    key = (os.getpid(), config_fingerprint(), budget_s)
    with _direct_lock:
        client = _direct.get(key)
        if client is None:
            client = _direct[key] = DirectClient(budget_s)
    return client


def _request_groups(ranges: Sequence[ByteRange], todo: list[int]) -> list[list[int]]:
    """The ranges ``todo`` in groups of one file spanning at most ``MAX_REQUEST_BYTES`` each: one
    ``get_ranges`` call per group, the groups fetched concurrently (obstore merges a group's
    neighbours into one request, with no size limit of its own)."""
    by_file: dict[str, list[int]] = defaultdict(list)
    for k in sorted(todo, key=lambda k: (ranges[k].name, ranges[k].start)):
        by_file[ranges[k].name].append(k)
    groups: list[list[int]] = []
    for ks in by_file.values():
        group = [ks[0]]
        for k in ks[1:]:
            if ranges[k].end - ranges[group[0]].start > MAX_REQUEST_BYTES:
                groups.append(group)
                group = []
            group.append(k)
        groups.append(group)
    return groups


def _gave_up(tries: int, start: float) -> str:
    return f"gave up after {tries} {'try' if tries == 1 else 'tries'} in {time.monotonic() - start:.1f} s"


class ObjectStoreSource(ByteSource):
    """The files under a URL; see the module docstring."""

    remote = True

    def __init__(self, url: str, *, client: Any = None) -> None:
        """``client``: the obstore client to use in this process (a ``DirectClient`` in a process that runs obstore itself)."""
        try:
            import obstore  # noqa: F401  (imported, never called here: see _client_for)
        except ImportError:
            raise ConfigError(f"{url}: reading from a URL needs obstore: {INSTALL_HINT}") from None
        self.location = url.rstrip("/")
        self.scheme = url_scheme(url)
        self.budget_s = retry_seconds()
        self._owner = os.getpid()
        self._fixed_client = client
        self._client: Any = None
        self._runner: DaemonPool | None = None
        self._random = random.Random()
        reset_after_fork(self, ObjectStoreSource._forget_parent)

    def where(self, name: str) -> str:
        return f"{self.location}/{name}"

    # ------------------------------------------------------------------ whole files

    def read_file(self, name: str) -> bytes:
        return self.read_files([name])[0]

    def read_files(self, names: Sequence[str]) -> list[bytes]:
        names = list(names)
        return [bytes(data) for data in self._retrying(names, lambda todo, timeout: self._io().get(self.location, todo, timeout))]

    def size(self, name: str) -> int:
        return self._retrying([name], lambda todo, timeout: [self._io().head(self.location, todo[0], timeout)])[0]

    def download(self, name: str, dest: str | os.PathLike) -> int:
        return self._retrying([name], lambda todo, timeout: [self._io().download(self.location, todo[0], os.fspath(dest), timeout)])[0]

    def download_range(self, name: str, dest: str | os.PathLike, start: int, end: int) -> int:
        return self._retrying(
            [name], lambda todo, timeout: [self._io().download_range(self.location, todo[0], os.fspath(dest), start, end, timeout)]
        )[0]

    def list_names(self) -> list[str] | None:
        sizes = self.list_sizes()
        return None if sizes is None else sorted(sizes)

    def list_sizes(self) -> dict[str, int] | None:
        """The files directly in the folder and their sizes, or None where the store cannot list (plain HTTP)."""
        if self.scheme in ("http", "https"):  # a plain HTTP folder has no listing
            return None
        return self._retrying([""], lambda todo, timeout: [self._io().list_sizes(self.location, timeout)])[0]

    def request_stats(self) -> dict[str, float] | None:
        return self._retrying([""], lambda todo, timeout: [self._io().request_stats(timeout)])[0]

    # ------------------------------------------------------------------ writing (imgpipe stage)

    def write_file(self, name: str, data: bytes) -> None:
        """Store ``data`` as file ``name`` (one request; the store shows the whole file or none of it)."""
        self._retrying([name], lambda todo, timeout: [self._io().put(self.location, todo[0], data, timeout)])

    def upload(self, name: str, path: str | os.PathLike) -> tuple[int, str]:
        """Upload the local file ``path`` as ``name`` (multipart, parts in parallel, when large); return
        its size and the sha256 of the bytes sent. The retry time grows by a second per MiB of the file."""
        budget_s = self.budget_s + os.path.getsize(path) / (1 << 20)
        return self._retrying(
            [name], lambda todo, timeout: [self._io().put_file(self.location, todo[0], os.fspath(path), timeout)], budget_s
        )[0]

    def delete(self, names: Sequence[str]) -> None:
        """Remove files from the folder (a missing one is no error)."""
        if names:
            self._retrying([""], lambda todo, timeout: [self._io().delete(self.location, list(names), timeout)])

    def _retrying(self, names: list[str], call: Callable[[list[str], float], list[Any]], budget_s: float | None = None) -> list[Any]:
        """``call(names still to do, time left)`` until every name has its answer; transient errors are
        retried for ``budget_s`` (default: the source's retry time)."""
        start = time.monotonic()
        deadline = start + (self.budget_s if budget_s is None else budget_s)
        results: list[Any] = [None] * len(names)
        reasons: dict[int, StoreError] = {}  # the last answer each failing name got (a try that timed out says less)
        todo = list(range(len(names)))
        tries = 0
        while todo:
            tries += 1
            answers = call([names[k] for k in todo], max(0.1, deadline - time.monotonic()))
            failed: list[int] = []
            for k, answer in zip(todo, answers):
                if not isinstance(answer, StoreError):
                    results[k] = answer
                elif answer.kind == TRANSIENT:
                    failed.append(k)
                    if answer.answered or k not in reasons:
                        reasons[k] = answer
                elif answer.kind == MISSING:
                    raise FileNotFoundError(f"{self.where(names[k])}: not found")
                else:
                    raise RemoteError(answer.message)
            todo = failed
            if failed and not self._pause(tries, deadline):
                k = failed[0]
                raise RemoteError(f"{self.where(names[k]) if names[k] else self.location}: {reasons[k]}; {_gave_up(tries, start)}")
        return results

    # ------------------------------------------------------------------ ranges

    def read_ranges(self, ranges: Sequence[ByteRange], check: RangeCheck | None = None) -> list[memoryview | ImgpipeError]:
        start = time.monotonic()
        deadline = start + self.budget_s
        out: list[memoryview | ImgpipeError | None] = [None] * len(ranges)
        todo = list(range(len(ranges)))
        reasons: dict[int, str] = {}
        wrong: dict[int, tuple[int, int]] = {}  # length and crc32 of bytes that failed, to tell damage in the store from damage in transit
        tries = 0
        while todo:
            tries += 1
            groups = _request_groups(ranges, todo)
            requests = [(ranges[ks[0]].name, [ranges[k].start for k in ks], [ranges[k].end for k in ks]) for ks in groups]
            answers = self._io().get_ranges(self.location, requests, max(0.1, deadline - time.monotonic()))
            retry: list[int] = []
            for ks, answer in zip(groups, answers):
                if isinstance(answer, StoreError):
                    for k in ks:
                        if answer.kind != TRANSIENT:
                            out[k] = self._range_error(ranges[k], str(answer))
                            continue
                        if answer.answered or k not in reasons:  # a try that timed out says less than an answer before it
                            reasons[k] = str(answer)
                        retry.append(k)
                    continue
                for k, data in zip(ks, answer):
                    view = memoryview(data)
                    name, first, end = ranges[k]
                    if len(view) != end - first:
                        reason: str | None = f"short body: {len(view)} of {end - first} bytes"
                    else:
                        reason = check(k, view) if check is not None else None
                    if reason is None:
                        out[k] = view
                        continue
                    seen = (len(view), crc32(view))
                    if wrong.get(k) == seen:  # in transit, damage differs from try to try
                        out[k] = self._range_error(
                            ranges[k], f"{reason}, twice alike: the stored file is damaged; run 'imgpipe verify {self.location}'"
                        )
                    else:
                        wrong[k], reasons[k] = seen, reason
                        retry.append(k)
            todo = sorted(retry)
            if todo and not self._pause(tries, deadline):
                for k in todo:
                    out[k] = self._range_error(ranges[k], f"{reasons[k]}; {_gave_up(tries, start)}")
                break
        return out  # type: ignore[return-value]  (every item is set)

    def submit_ranges(self, ranges: Sequence[ByteRange], check: RangeCheck | None = None) -> Future[list[memoryview | ImgpipeError]]:
        self._io()
        assert self._runner is not None
        return self._runner.submit(self.read_ranges, list(ranges), check)

    def direct_client(self) -> DirectClient | None:
        """This process's own obstore client, or None where a helper process makes its requests (the
        process that opened the URL: see ``_client_for``)."""
        client = self._io()
        return client if isinstance(client, DirectClient) else None

    def _range_error(self, byte_range: ByteRange, reason: str) -> RangeError:
        return RangeError(self.where(byte_range.name), byte_range.start, reason)

    # ------------------------------------------------------------------ process safety

    def _io(self) -> Any:
        if self._client is None:
            self._client = self._fixed_client or _client_for(self._owner, self.budget_s)
            self._runner = DaemonPool(FETCH_THREADS, "imgpipe-fetch")  # a batch being read and those fetched ahead of their use
        return self._client

    def _forget_parent(self) -> None:
        """In a forked child: the parent's client and threads are not this process's (it makes its own)."""
        self._client, self._runner, self._random = None, None, random.Random()

    def _pause(self, tries: int, deadline: float) -> bool:
        """Sleep before try ``tries + 1`` (exponential backoff, full jitter); False when the time is up."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, self._random.uniform(0, min(_MAX_BACKOFF_S, _BACKOFF_S * 2 ** (tries - 1)))))
        return True

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_client=None, _fixed_client=None, _runner=None, _random=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._random = random.Random()
        reset_after_fork(self, ObjectStoreSource._forget_parent)
