"""One rank that imgpipe's launcher started: ``python -m imgpipe.train.rank_main FOLDER`` (see :mod:`imgpipe.train.local_ranks`).

torch's elastic agent starts it in a session of its own, with RANK, WORLD_SIZE, MASTER_ADDR/PORT and
TORCHELASTIC_ERROR_FILE set. FOLDER holds what the launcher and its ranks share: the call (``fn``,
``arg``, options), each rank's pid once its stop handling is in place, the launcher's stop request and
rank 0's result. What a rank adds to torchrun's: it dies with the launcher, workers and all; a stop
signal never kills it inside a collective (the trainer's loop checkpoints and stops; other code stops
when the call returns; at the grace the rank says it was stuck and ends its process group); how it
ended (failed, stopped, stuck) and when, to the microsecond, is in torch's error file (``record``),
which the launcher reads to name the rank at fault.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import shutil
import signal
import sys
import threading
import time
import traceback
from multiprocessing import spawn
from pathlib import Path
from typing import Any, Callable

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from imgpipe._sys.atomic import atomic_write, atomic_write_bytes
from imgpipe._sys.procs import die_with_parent, end_descendants, exit_now
from imgpipe._sys.signalwatch import SignalWatch

CALL = "call.pkl"
STOP = "stop"
RESULT = "result.pkl"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclasses.dataclass(frozen=True)
class RankOptions:
    """What every rank of one launch gets besides ``fn`` and ``arg``."""

    launcher_pid: int
    log_level: int
    use_cuda: bool
    backend: str | None
    timeout_s: float
    grace_s: float
    threads: int | None  # torch's threads per rank (None: torch's default, or OMP_NUM_THREADS)


# ----------------------------------------------------------------------------- the folder, from the launcher's side


def write_call(folder: Path, fn: Callable, arg: Any, options: RankOptions) -> None:
    """``fn``, ``arg`` and ``options`` for the ranks, after what a rank needs to unpickle them (the launcher's
    sys.path and main module: multiprocessing's spawn does the same)."""

    preparation = spawn.get_preparation_data("imgpipe-rank")
    del preparation["authkey"]  # multiprocessing's own secret, for its own connections: the ranks make none

    def write(f: Any) -> None:
        pickle.dump(preparation, f)
        pickle.dump((fn, arg, options), f)

    atomic_write(folder / CALL, write)


def request_stop(folder: Path, signum: int) -> None:
    """Tell ranks that register from now on that the run was asked to stop (the launcher signals those already registered)."""
    atomic_write_bytes(folder / STOP, str(int(signum)).encode())


def registered_pids(folder: Path) -> dict[int, int]:
    """rank -> pid, for each rank whose stop handling is in place."""
    pids = {}
    for path in folder.glob("rank-*.pid"):
        try:
            pids[int(path.stem.split("-")[1])] = int(path.read_text())
        except (OSError, ValueError):  # being written
            continue
    return pids


def read_result(folder: Path) -> Any:
    """Rank 0's result (the launcher's own temporary folder holds it: trusted)."""
    with open(folder / RESULT, "rb") as f:
        return pickle.load(f)


def read_report(failure: Any) -> dict[str, Any] | None:
    """The report a rank wrote in torch's error file (a ``ProcessFailure``'s ``error_file_data``), or None."""
    message = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
    report = message.get("extraInfo", {}).get("imgpipe") if isinstance(message, dict) else None
    return report if isinstance(report, dict) else None


# ----------------------------------------------------------------------------- the rank


def main(folder: Path) -> None:
    """Run this rank's share of the call in ``folder`` and end the process (``os._exit``)."""
    with open(folder / CALL, "rb") as f:
        spawn.prepare(pickle.load(f))
        fn, arg, options = pickle.load(f)
    if os.getpgrp() != os.getpid():  # torch starts ranks in a session of their own; be sure of it, for killpg below
        os.setsid()
    die_with_parent(options.launcher_pid, whole_group=True, last=lambda: shutil.rmtree(folder, ignore_errors=True))  # the launcher's
    from tqdm import tqdm

    # tqdm's default lock is a multiprocessing lock, a named semaphore, which the os._exit
    # below would leave to the resource tracker's "leaked semaphore" warning
    tqdm.set_lock(threading.RLock())
    from imgpipe.distenv import DistEnv

    env = DistEnv.detect()
    prefix = "imgpipe" if env.rank == 0 else f"imgpipe[rank {env.rank}]"
    logging.basicConfig(level=options.log_level, format=f"{prefix}: %(levelname)s: %(message)s", stream=sys.stderr)
    report = Report()
    for signum in STOP_SIGNALS:  # until the trainer's loop takes them (train.stopping): stop now, with a report
        signal.signal(signum, _stop_now)
    Grace(options.grace_s, report).watch.install()
    _register(folder, env.rank, report)
    _exit_now(_run(fn, arg, env, options, folder, report))


def _stop_now(signum: int, _frame: object) -> None:
    """Unwind the main thread (a rank in a collective only once it returns: a rank never dies in one)."""
    from imgpipe.errors import Stopped

    raise Stopped(signum)


def _register(folder: Path, rank: int, report: Report) -> None:
    """Make this rank's pid known to the launcher; a stop it asked for before then ends the rank now, reported as a stop."""
    atomic_write_bytes(folder / f"rank-{rank}.pid", str(os.getpid()).encode())
    try:
        signum = int((folder / STOP).read_text())
    except (OSError, ValueError):
        return
    report.write("stopped", f"stopped by {signal.Signals(signum).name}")
    _exit_now(128 + signum)


def _run(fn: Callable, arg: Any, env: Any, options: RankOptions, folder: Path, report: Report) -> int:
    from imgpipe.errors import ImgpipeError, Stopped
    from imgpipe.train.rank import run_rank

    def run() -> None:
        if options.threads is not None:
            import torch

            torch.set_num_threads(options.threads)
        result = run_rank(report.timed(fn), arg, env, use_cuda=options.use_cuda, backend=options.backend, timeout_s=options.timeout_s)
        if env.rank == 0:
            atomic_write(folder / RESULT, lambda f: pickle.dump(result, f))

    try:
        record(run, error_handler=report)()
    except ImgpipeError as e:
        return e.exit_code
    except Exception:
        return 1
    except (Stopped, KeyboardInterrupt) as e:  # a signal: before the loop took them, or a second Ctrl-C
        report.record_exception(e)
        return 130 if isinstance(e, KeyboardInterrupt) else e.exit_code
    return 0


def _exit_now(code: int) -> None:
    """End this rank: its worker processes, then the process with the logs and output flushed (``exit_now``: no teardown,
    where torch's and gloo's threads can abort a rank that has done its work, "terminate called without an active exception").
    A stop signal from here on would only unwind the ending with a traceback: it is ignored (Grace still ends a stuck rank)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    end_descendants(grace_s=1.0)
    logging.shutdown()
    exit_now(code)


class Report(ErrorHandler):
    """torch's error handler for ``record``, whose error file (in torch's format) also holds imgpipe's part under
    ``extraInfo``: the kind of failure, its one line and when it happened: when it left ``fn``, before the rank
    leaves its process group (which a peer sees as a failure of its own)."""

    failed_at: float | None = None

    def timed(self, fn: Callable) -> Callable:
        def run(ctx: Any, arg: Any) -> Any:
            try:
                return fn(ctx, arg)
            except BaseException:
                self.failed_at = time.time()
                raise

        return run

    def record_exception(self, e: BaseException) -> None:
        from imgpipe.errors import ImgpipeError, Stopped
        from imgpipe.train.rank import timed_out

        waited = any(timed_out(str(cause)) for cause in _chain(e))  # also under the error a stop caused next (a killed worker)
        if isinstance(e, (Stopped, KeyboardInterrupt)):
            signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
            self.write("stopped", f"stopped by {signal.Signals(signum).name}", timed_out=waited)
        elif isinstance(e, ImgpipeError):
            self.write("error", str(e), timed_out=waited)
        else:  # a bug, or torch's own error (a collective that timed out, a peer that vanished): the launcher decides
            first = str(e).splitlines()[0] if str(e) else ""
            self.write("exception", f"{type(e).__name__}: {first}", traceback.format_exc(), timed_out=waited)

    def write(self, kind: str, line: str, callstack: str = "", timed_out: bool = False) -> None:
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not path or os.path.exists(path):  # the first report stands
            return
        when = self.failed_at or time.time()
        report = {"kind": kind, "line": line, "time": when, "timed_out": timed_out}
        info = {"py_callstack": callstack, "timestamp": str(int(when)), "imgpipe": report}
        atomic_write_bytes(path, json.dumps({"message": {"message": line, "extraInfo": info}}).encode())


def _chain(e: BaseException | None) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or while handling."""
    found: list[BaseException] = []
    while e is not None and e not in found:
        found.append(e)
        e = e.__cause__ or e.__context__
    return found


class Grace:
    """From the first stop signal, ``grace_s`` for this rank to end; then it reports itself stuck and SIGKILLs its
    process group (itself and its workers). Its watch sees the signal even while the main thread is stuck in a call."""

    def __init__(self, grace_s: float, report: Report) -> None:
        self.grace_s = grace_s
        self.report = report
        self.signum: int | None = None
        self.watch = SignalWatch(self._on_signal, self._expire)

    def _on_signal(self, signum: int) -> None:
        if signum in STOP_SIGNALS and self.signum is None:
            self.signum = signum
            self.watch.expire_by(time.monotonic() + self.grace_s)

    def _expire(self) -> None:
        name = signal.Signals(self.signum or signal.SIGTERM).name
        self.report.write("stuck", f"did not stop within {self.grace_s:g} s of {name}")
        os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
