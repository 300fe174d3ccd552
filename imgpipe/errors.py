"""imgpipe's exceptions: every user-facing failure is one of these, with a one-line message."""

from __future__ import annotations

import signal


class ImgpipeError(Exception):
    """A problem the user can act on; the CLI prints it as one line and exits non-zero."""

    exit_code = 1


class RecordIOError(ImgpipeError):
    """A malformed RecordIO file or index; names the file and the byte offset."""

    def __init__(self, path: object, offset: int, problem: str) -> None:
        self.path = str(path)
        self.offset = offset
        self.problem = problem
        super().__init__(f"{self.path}: offset {offset}: {problem}")


class DatasetError(ImgpipeError):
    """A dataset folder, manifest or shard set that cannot be used as asked."""


class RemoteError(DatasetError):
    """A URL that cannot be read: a missing bucket, refused credentials, an unreachable store, or a
    file or record still unreadable when the retry time ran out; names the URL (and the record)."""


class PackError(ImgpipeError):
    """`imgpipe pack` refuses to start or cannot finish."""


class ConfigError(ImgpipeError):
    """A training or bench configuration that is invalid."""


class DistributedError(ImgpipeError):
    """A launch or process-group problem, with the rank and the fix."""


class TrainError(ImgpipeError):
    """Training stopped for a reason the user can fix (out of memory, a DDP misuse), with the fix."""


class Stopped(BaseException):
    """SIGTERM or SIGINT (or SIGHUP) stopped the work. Like KeyboardInterrupt it is no ``Exception``, so no
    ``except Exception`` turns it into another error on its way up; the CLI prints it as one line
    and exits 128 + the signal's number (143, 130, 129), as a process killed by it would."""

    def __init__(self, signum: int, detail: str = "") -> None:
        self.signum = int(signum)
        self.detail = detail
        super().__init__(f"stopped by {signal.Signals(self.signum).name}" + (f": {detail}" if detail else ""))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
