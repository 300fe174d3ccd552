"""obstore calls for one process: a store per URL, concurrency across files, errors as values.

obstore keeps one tokio runtime per process, and a process forked after it made a request hangs on its
next one. So a ``DirectClient`` runs only in a process whose parent never used obstore itself
(``direct_allowed``); the others ask ``store_helper``. Every method takes a time limit and returns a
``StoreError`` instead of raising, so a batch keeps the ranges that arrived and retries the rest; local
files a method reads or writes are opened by the process that runs obstore.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Sequence

from imgpipe._sys.checksum import hashed_blocks
from imgpipe._sys.threads import DaemonPool
from imgpipe._sys.writes import write_at

IO_THREADS = 32  # concurrent requests of one process, across files (each get_ranges adds up to 10 of its own)
COALESCE_BYTES = 256 * 1024  # ranges of one file closer than this are fetched by one request
STREAM_CHUNK_BYTES = 1 << 20  # a streamed body is handed over in chunks of at least this size
UPLOAD_PART_BYTES = 16 << 20  # a file larger than this is uploaded in parts of this size (multipart), several at once
UPLOAD_CONCURRENCY = 8  # parts of one file in flight
CONNECT_TIMEOUT_S = 5
MAX_STALL_S = 10  # a response that sends nothing for this long (a third of the retry time if less) is cut off

# Environment variables that configure a store: a client made under other values is not reused.
_CONFIG_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "GCE_METADATA_", "OBJECT_STORE_")
# Where each store's credentials come from, for the message that says they are missing or refused.
_AWS_CREDENTIALS = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the store's own variables"
_GCS_CREDENTIALS = "GOOGLE_SERVICE_ACCOUNT or GOOGLE_APPLICATION_CREDENTIALS, or the instance's service account"
_AZURE_CREDENTIALS = (
    "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN, a service principal (AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_TENANT_ID) "
    "or a managed identity"
)
_AZURE_SCHEMES = ("az", "azure", "adl", "abfs", "abfss")

MISSING, NO_BUCKET, DENIED, TRANSIENT, FAILED = "missing", "no bucket", "denied", "transient", "failed"

_direct_pid: int | None = None  # the process whose obstore runtime exists (None: none has run here)


class StoreError(Exception):
    """A failed store call: ``kind`` (MISSING, NO_BUCKET, DENIED: final; TRANSIENT: worth another try;
    FAILED: final: what cannot change on another try) and a one-line ``message``. ``answered``: False
    when no answer came within the call's time (a retry that times out says less than the answer
    an earlier try got)."""

    def __init__(self, kind: str, message: str, *, answered: bool = True) -> None:
        super().__init__(kind, message, answered)
        self.kind = kind
        self.message = message
        self.answered = answered

    def __reduce__(self) -> tuple[Any, ...]:
        return _store_error, (self.kind, self.message, self.answered)

    def __str__(self) -> str:
        return self.message


def _store_error(kind: str, message: str, answered: bool) -> StoreError:
    return StoreError(kind, message, answered=answered)


def no_answer(timeout: float) -> StoreError:
    """The error of a call that got no answer within ``timeout`` seconds (worth another try)."""
    return StoreError(TRANSIENT, f"no answer within {timeout:.1f} s", answered=False)


def config_fingerprint(environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The store-configuring environment variables and their values."""
    env = os.environ if environ is None else environ
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_CONFIG_PREFIXES)))


def direct_allowed() -> bool:
    """True when obstore can run in this process: no runtime exists, or it is this process's own."""
    return _direct_pid in (None, os.getpid())


def make_store(url: str, budget_s: float) -> Any:
    """The obstore store of ``url``, configured from the store's standard environment variables.

    ``allow_http`` lets an ``http://`` endpoint (``AWS_ENDPOINT_URL``, an HTTP folder) work as
    given. Without ``AWS_ACCESS_KEY_ID``, an AWS profile (``AWS_PROFILE`` or ~/.aws) is read
    through boto3 when it is installed, as the AWS tools read it (obstore reads no profiles).
    """
    from obstore.store import from_url

    request_s = max(1.0, min(budget_s, 30.0))
    stall_s = max(1.0, min(budget_s / 3, MAX_STALL_S))  # a response silent this long is cut off and fetched again
    client = {
        "allow_http": True,
        "connect_timeout": timedelta(seconds=CONNECT_TIMEOUT_S),
        "timeout": timedelta(seconds=request_s),
        "read_timeout": timedelta(seconds=stall_s),
    }
    retry = {
        "max_retries": 10,
        "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2), "base": 2},
        # a third of the retry time: the caller retries what failed in the time left, and a GCS client
        # without credentials asks the metadata server twice (by name, then by address) in rounds of this
        # length, so that its answer (no credentials) comes before the caller's time is up
        "retry_timeout": timedelta(seconds=budget_s / 3),
    }
    extra: dict[str, Any] = {}
    if url.split("://", 1)[0].lower() in ("s3", "s3a"):
        provider = _aws_profile_credentials()
        if provider is not None:
            extra["credential_provider"] = provider
    return from_url(url, client_options=client, retry_config=retry, **extra)


def _aws_profile_credentials() -> Any:
    """boto3's credential chain (profiles, SSO, ~/.aws) when the environment has no keys and names a profile or has ~/.aws files."""
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    files = [os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), os.environ.get("AWS_CONFIG_FILE", "~/.aws/config")]
    if not os.environ.get("AWS_PROFILE") and not any(os.path.isfile(os.path.expanduser(f)) for f in files):
        return None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None
    try:
        return Boto3CredentialProvider(boto3.Session())
    except Exception:  # no credentials in the profile chain (ValueError), a broken profile file: obstore's own chain decides
        return None


def store_error(error: BaseException, url: str, name: str = "") -> StoreError:
    """An exception of a store call as a StoreError: its kind and one short line. Only obstore's own
    errors of the network and the server may be worth another try; anything else (a range obstore
    refuses to ask for, a bug) is the same on every try, and final."""
    from obstore import exceptions as ox

    text = " ".join(str(error).split())
    code = re.search(r"<Code>([^<]+)</Code>", str(error))
    status = re.search(r"status code: (\d{3})", text)
    detail = error_detail(error)
    if code is not None and code[1] == "NoSuchBucket":
        return StoreError(NO_BUCKET, f"{url}: the bucket does not exist")
    if isinstance(error, (ox.NotFoundError, FileNotFoundError)):  # obstore raises the built-in one for a missing object
        return StoreError(MISSING, f"{url}/{name}: not found" if name else f"{url}: not found")
    if not isinstance(error, ox.BaseError):  # a ValueError (obstore's for a bad argument), an OverflowError, ...
        return StoreError(FAILED, f"{url}/{name}: {type(error).__name__}: {detail}" if name else f"{url}: {type(error).__name__}: {detail}")
    if "Error performing token request" in text:  # obstore already retried the credential service (GCE metadata, Azure's managed identity)
        return StoreError(DENIED, f"{url}: no credentials: the request for a token failed; set {credential_variables(url)}")
    if isinstance(error, (ox.PermissionDeniedError, ox.UnauthenticatedError)) or (status and status[1] in ("401", "403")):
        why = code[1] if code else f"HTTP {status[1]}" if status else type(error).__name__
        return StoreError(DENIED, f"{url}: access denied ({why}); check the credentials ({credential_variables(url)})")
    if status and status[1].startswith("4") and status[1] not in ("408", "429"):
        return StoreError(FAILED, f"{url}/{name}: {detail}")
    final = (ox.InvalidPathError, ox.NotSupportedError, ox.UnknownConfigurationKeyError, ox.AlreadyExistsError, ox.PreconditionError)
    if isinstance(error, (*final, ox.NotModifiedError)):
        return StoreError(FAILED, f"{url}: {detail}")
    if status:  # a 5xx, 408 or 429 that obstore already retried for a while: name it, not the retrying
        reason = re.search(rf"status code: {status[1]} ([A-Za-z][A-Za-z ]*?)(?::|$| -)", text)
        return StoreError(TRANSIENT, f"the server answered HTTP {status[1]}" + (f" {reason[1].strip()}" if reason else ""))
    return StoreError(TRANSIENT, detail or type(error).__name__)


def error_detail(error: BaseException) -> str:
    """An obstore exception's message on one short line, without the XML body or the Rust debug dump after it."""
    return re.sub(r"\s*(<\?xml|Debug source:).*", "", " ".join(str(error).split()))[:300]


def credential_variables(url: str) -> str:
    """The standard variables that give the store of ``url`` its credentials, for a message."""
    scheme = url.split("://", 1)[0].lower()
    if scheme == "gs":
        return _GCS_CREDENTIALS
    return _AZURE_CREDENTIALS if scheme in _AZURE_SCHEMES else _AWS_CREDENTIALS


def local_error(path: str, error: OSError, *, writing: bool) -> StoreError:
    """A local file's OSError met inside a store call: final, and named as what it is (not a store error)."""
    from imgpipe._sys.oserrors import describe

    return StoreError(FAILED, f"{path}: {describe(error, writing=writing)}")


def coalesced_requests(starts: Sequence[int], ends: Sequence[int]) -> int:
    """How many requests obstore makes for these ranges of one file: ranges closer than
    ``COALESCE_BYTES`` (sorted by start) are merged into one."""
    count, reach = 0, None
    for start, end in sorted(zip(starts, ends)):
        if reach is None or start - reach > COALESCE_BYTES:
            count += 1
            reach = end
        else:
            reach = max(reach, end)
    return count


class DirectClient:
    """obstore in this process: one store per URL, ``IO_THREADS`` daemon threads for the requests."""

    def __init__(self, budget_s: float) -> None:
        global _direct_pid
        _direct_pid = os.getpid()
        self.budget_s = budget_s
        self._stores: dict[str, Any] = {}
        self._pool = DaemonPool(IO_THREADS, "imgpipe-io")
        self._counts = {"calls": 0, "requests": 0, "bytes": 0, "seconds": 0.0}  # of the get_ranges calls that succeeded
        self._counts_lock = threading.Lock()

    def get(self, url: str, names: Sequence[str], timeout: float) -> list[bytes | StoreError]:
        """Whole files, concurrently."""
        import obstore

        return self._gather([(self._call, (url, name, lambda store, n=name: obstore.get(store, n).bytes())) for name in names], timeout)

    def head(self, url: str, name: str, timeout: float) -> int | StoreError:
        """The size of a file."""
        import obstore

        return self._gather([(self._call, (url, name, lambda store: int(obstore.head(store, name)["size"])))], timeout)[0]

    def get_ranges(
        self, url: str, files: Sequence[tuple[str, Sequence[int], Sequence[int]]], timeout: float
    ) -> list[list[Any] | StoreError]:
        """For each (file, starts, ends): its ranges' bytes, one ``get_ranges`` per file (neighbours coalesced), files concurrently."""
        import obstore

        def ranges(name: str, starts: Sequence[int], ends: Sequence[int]) -> Callable[[Any], list[Any]]:
            def fetch(store: Any) -> list[Any]:
                began = time.perf_counter()
                got = obstore.get_ranges(store, name, starts=list(starts), ends=list(ends), coalesce=COALESCE_BYTES)
                self._count(coalesced_requests(starts, ends), sum(len(b) for b in got), time.perf_counter() - began)
                return got

            return fetch

        return self._gather([(self._call, (url, name, ranges(name, starts, ends))) for name, starts, ends in files], timeout)

    def request_stats(self, timeout: float) -> dict[str, float]:
        """What this process's range reads cost so far: ``calls`` (one per file and batch), the HTTP
        ``requests`` they made, the ``bytes`` they brought and the ``seconds`` the calls took, summed."""
        with self._counts_lock:
            return dict(self._counts)

    def _count(self, requests: int, size: int, seconds: float) -> None:
        with self._counts_lock:
            self._counts["calls"] += 1
            self._counts["requests"] += requests
            self._counts["bytes"] += size
            self._counts["seconds"] += seconds

    def download(self, url: str, name: str, dest: str, timeout: float) -> int | StoreError:
        """Stream a whole file to the local path ``dest``."""
        import obstore

        def stream(store: Any) -> int | StoreError:
            size = 0
            try:
                f = open(dest, "wb")
            except OSError as e:
                return local_error(dest, e, writing=True)
            with f:
                for chunk in obstore.get(store, name).stream(min_chunk_size=8 << 20):
                    try:
                        f.write(chunk)
                    except OSError as e:
                        return local_error(dest, e, writing=True)
                    size += len(chunk)
            return size

        return self._gather([(self._call, (url, name, stream))], timeout)[0]

    def stream(self, url: str, name: str, start: int, end: int, sink: Callable[[int, Any], None], timeout: float) -> int | StoreError:
        """Bytes ``[start, end)`` of a file, one request, handed to ``sink(offset, chunk)`` as they arrive;
        the count handed over, or the error that stopped the request (``sink`` may have had part)."""
        import obstore

        def pull(store: Any) -> int:
            at = start
            for chunk in obstore.get(store, name, options={"range": (start, end)}).stream(min_chunk_size=STREAM_CHUNK_BYTES):
                sink(at, chunk)
                at += len(chunk)
            return at - start

        return self._gather([(self._call, (url, name, pull))], timeout)[0]

    def download_range(self, url: str, name: str, dest: str, start: int, end: int, timeout: float) -> int | StoreError:
        """Bytes ``[start, end)`` of a file written at the same offset of the existing local file ``dest``."""
        import obstore

        def fetch(store: Any) -> int | StoreError:
            try:
                fd = os.open(dest, os.O_WRONLY)
            except OSError as e:
                return local_error(dest, e, writing=True)
            written = start
            try:
                for chunk in obstore.get(store, name, options={"range": (start, end)}).stream(min_chunk_size=4 << 20):
                    try:
                        write_at(fd, chunk, written)
                    except OSError as e:
                        return local_error(dest, e, writing=True)
                    written += len(chunk)
            finally:
                os.close(fd)
            if written != end:
                return StoreError(TRANSIENT, f"short body: {written - start} of {end - start} bytes")
            return end - start

        return self._gather([(self._call, (url, name, fetch))], timeout)[0]

    def put(self, url: str, name: str, data: bytes, timeout: float) -> int | StoreError:
        """Write a small file (one request)."""
        import obstore

        def write(store: Any) -> int:
            obstore.put(store, name, data, use_multipart=False)
            return len(data)

        return self._gather([(self._call, (url, name, write))], timeout)[0]

    def put_file(self, url: str, name: str, path: str, timeout: float) -> tuple[int, str] | StoreError:
        """Upload the local file ``path`` as ``name`` (a large one as a multipart upload, parts in parallel);
        return its size and the sha256 of the bytes sent."""
        import obstore

        def upload(store: Any) -> tuple[int, str] | StoreError:
            digest = hashlib.sha256()
            try:
                source = open(path, "rb")
                size = os.fstat(source.fileno()).st_size
            except OSError as e:
                return local_error(path, e, writing=False)
            with source:
                chunks = hashed_blocks(source, UPLOAD_PART_BYTES, digest)  # the bytes sent are the bytes hashed
                if size > UPLOAD_PART_BYTES:
                    obstore.put(store, name, chunks, chunk_size=UPLOAD_PART_BYTES, max_concurrency=UPLOAD_CONCURRENCY)
                else:
                    obstore.put(store, name, b"".join(chunks), use_multipart=False)
            return size, digest.hexdigest()

        return self._gather([(self._call, (url, name, upload))], timeout)[0]

    def delete(self, url: str, names: Sequence[str], timeout: float) -> None | StoreError:
        """Remove files (a missing one is no error)."""
        import obstore

        return self._gather([(self._call, (url, "", lambda store: obstore.delete(store, list(names))))], timeout)[0]

    def list_sizes(self, url: str, timeout: float) -> dict[str, int] | StoreError:
        """The objects directly under the URL and their sizes."""
        import obstore

        def sizes(store: Any) -> dict[str, int]:
            listed = obstore.list_with_delimiter(store)
            return {meta["path"].rsplit("/", 1)[-1]: int(meta["size"]) for meta in listed["objects"]}

        return self._gather([(self._call, (url, "", sizes))], timeout)[0]

    def _store(self, url: str) -> Any:
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = make_store(url, self.budget_s)
        return store

    def _call(self, url: str, name: str, request: Callable[[Any], Any]) -> Any:
        try:
            store = self._store(url)
        except Exception as e:  # obstore refused the URL itself (an invalid host, an unknown scheme): no retry mends that
            return StoreError(FAILED, f"{url}: not a URL imgpipe can read ({error_detail(e)})")
        try:
            return request(store)
        except Exception as e:  # every obstore failure becomes a value; the caller decides
            return store_error(e, url, name)

    def _gather(self, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]], timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        futures = [self._pool.submit(fn, *args) for fn, args in calls]
        out = []
        for future in futures:
            try:
                out.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                out.append(no_answer(timeout))
        return out
