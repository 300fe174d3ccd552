"""N ranks on this machine (``--gpus N``, ``--nproc N``), started and watched by torch's ``elastic_launch``.

torchrun's launch API starts each rank (:mod:`imgpipe.train.rank_main`) in a session of its own, gives
them their c10d rendezvous, stops the others when one fails and, at its shutdown timeout, kills each
rank's whole process group. Kept here is what it lacks (docs/training.md): one line naming the rank
that failed, died or hung, not a peer that saw it vanish (:func:`diagnose`); SIGTERM or Ctrl-C as
checkpoint-and-stop, every rank and worker ended at the grace or on a second signal (:class:`StopRanks`);
what a rank that died leaves behind (its stuck workers) ended too (``ending_orphans``); CPU ranks sharing
the cores (:func:`cpu_threads`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.procs import ending_orphans
from imgpipe.errors import DistributedError, Stopped
from imgpipe.train import rank_main

logger = logging.getLogger(__name__)

T = TypeVar("T")

MONITOR_S = 0.1  # how often torch's agent looks at the ranks
TORCH_GRACE_MARGIN_S = 5  # torch's agent kills a rank's process group this long after the rank's own grace
TORCH_SHUTDOWN_S = 30  # that wait where LaunchConfig has no shutdown_timeout (older torch, 2.11 among them)
TORCH_SIGNALS = "SIGHUP,SIGQUIT"  # torch's agent stops the ranks on these; SIGTERM and SIGINT are imgpipe's: checkpoint and stop


def start_local_ranks(
    fn: Callable[[Any, Any], T], arg: Any, ranks: int, *, use_cuda: bool, backend: str | None, timeout_s: float, grace_s: float
) -> T:
    """Run ``fn(ctx, arg)`` on ``ranks`` ranks started here and return rank 0's result.

    A rank that fails, dies or hangs is one DistributedError naming it; when SIGTERM or Ctrl-C stopped
    the run before every rank returned, ``Stopped``.
    """
    with tempfile.TemporaryDirectory(prefix="imgpipe-ranks-") as tmp:
        folder = Path(tmp)
        shutdown = {"shutdown_timeout": math.ceil(grace_s) + TORCH_GRACE_MARGIN_S}
        if "shutdown_timeout" not in LaunchConfig.__dataclass_fields__:
            shutdown, grace_s = {}, min(grace_s, TORCH_SHUTDOWN_S - TORCH_GRACE_MARGIN_S)
        threads = None if use_cuda else cpu_threads(ranks, os.environ)
        level = logging.getLogger().getEffectiveLevel()
        options = rank_main.RankOptions(os.getpid(), level, use_cuda, backend, timeout_s, grace_s, threads)
        rank_main.write_call(folder, fn, arg, options)
        run_id = f"imgpipe-{uuid.uuid4().hex}"
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=ranks,
            run_id=run_id,
            role="imgpipe",
            rdzv_backend="c10d",
            rdzv_endpoint="127.0.0.1:0",
            local_addr="127.0.0.1",
            max_restarts=0,
            monitor_interval=MONITOR_S,
            logs_specs=DefaultLogsSpecs(log_dir=str(folder / "logs")),
            signals_to_handle=TORCH_SIGNALS,
            **shutdown,
        )
        with StopRanks(folder, grace_s) as stop, _torch_launcher_state(), ending_orphans("TORCHELASTIC_RUN_ID", run_id):
            try:
                elastic_launch(config, sys.executable)("-m", rank_main.__name__, str(folder))
            except ChildFailedError as e:
                line, callstack = diagnose(e.failures, timeout_s, stopping=stop.signum is not None)
            except SignalException as e:  # SIGHUP or SIGQUIT: torch's agent stopped the ranks
                raise Stopped(e.sigval, "stopped every rank") from None
            else:
                return rank_main.read_result(folder)
    if stop.signum is not None:
        raise Stopped(stop.signum, stop.detail(line))
    if callstack:  # a bug's traceback, as the rank had it
        sys.stderr.write(callstack)
    raise DistributedError(line)


class StopRanks:
    """While the ranks run, SIGTERM or SIGINT to the launcher goes on to every rank (each checkpoints and stops);
    after ``grace_s``, or on a second signal, every rank's process group is killed: the rank and its workers."""

    def __init__(self, folder: Path, grace_s: float) -> None:
        self.folder = folder
        self.grace_s = grace_s
        self.signum: int | None = None
        self.killed: str | None = None  # when the ranks were killed, if they were
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRanks:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: set outside Python

    def detail(self, line: str) -> str:
        """What the stop did, for its one line."""
        return f"killed every rank still running, and its workers, {self.killed}" if self.killed else line

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is not None:
            self.kill("on the second signal")
            return
        self.signum = signum
        rank_main.request_stop(self.folder, signum)  # a rank that registers from now on stops at once
        logger.warning("got %s: asking every rank to stop (send it again to kill them)", signal.Signals(signum).name)
        self._send(signum)
        self._timer = threading.Timer(self.grace_s + 1.0, self.kill, (f"after {self.grace_s:g} s",))  # rank_main.Grace first
        self._timer.daemon = True
        self._timer.start()

    def kill(self, when: str) -> None:
        """SIGKILL every rank's process group (it leads its own), now."""
        if self._timer is not None:
            self._timer.cancel()
        self.killed = self.killed or when
        self._send(signal.SIGKILL, group=True)

    def _send(self, signum: int, group: bool = False) -> None:
        import psutil

        for pid in rank_main.registered_pids(self.folder).values():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if psutil.Process(pid).ppid() == os.getpid():  # still our rank, not a later process with its pid
                    (os.killpg if group else os.kill)(pid, signum)


@contextlib.contextmanager
def _torch_launcher_state() -> Iterator[None]:
    """What torch's launch API leaves set in this process: the handlers of TORCH_SIGNALS and the environment
    variable that names them (TORCHELASTIC_SIGNALS_TO_HANDLE); given back after."""
    name = "TORCHELASTIC_SIGNALS_TO_HANDLE"
    before_env = os.environ.get(name)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGHUP, signal.SIGQUIT)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if before_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before_env


def cpu_threads(ranks: int, environ: Any) -> int | None:
    """Torch threads for each of ``ranks`` CPU ranks started here: this process's CPUs shared between them,
    as torchrun's OMP_NUM_THREADS=1 and the bench share them (each rank's default, all the cores, makes
    their OpenMP threads wait on each other at every operation); None where OMP_NUM_THREADS is set."""
    if environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, available_cpus() // ranks)


# ----------------------------------------------------------------------------- the rank at fault


def diagnose(failures: dict[int, Any], timeout_s: float, stopping: bool = False) -> tuple[str, str]:
    """(the one line, a bug's traceback or "") from torch's ``ProcessFailure`` of each rank that did not end well.

    A rank reports its failure before it leaves the process group, and a peer fails only after that: so the
    rank at fault is the first that died without a report (killed, or crashed in C; the others may have been killed
    after it, by torch's agent or their grace), else the earliest report. When
    that is a collective that timed out, the hung ranks are those that did not time out in one: they were
    elsewhere when torch's agent stopped every rank, and failed then or did not stop within their grace.
    ``stopping``: the launcher was asked to stop the run.
    """
    reports = {rank: rank_main.read_report(failure) or _ended_by_the_stop(failure, stopping) for rank, failure in failures.items()}
    died = sorted((rank for rank, report in reports.items() if report is None), key=lambda rank: (failures[rank].timestamp, rank))
    if died:
        code = failures[died[0]].exitcode
        how = f" (killed by {signal.Signals(-code).name})" if code < 0 else ""
        return f"rank {died[0]} exited with code {code}{how}", ""
    failed = sorted((report["time"], rank) for rank, report in reports.items() if report["kind"] in ("error", "exception"))
    stuck = sorted(rank for rank, report in reports.items() if report["kind"] == "stuck")
    if not failed:  # stopped by a signal, and ended at the grace
        if not stuck:
            return "stopped every rank" if stopping else f"stopped every rank ({reports[min(reports)]['line']})", ""
        return f"{_ranks(stuck)} {reports[stuck[0]]['line']}: ended {'them' if len(stuck) > 1 else 'it'} and the workers", ""
    first = reports[failed[0][1]]
    waited = sorted(rank for rank, report in reports.items() if report.get("timed_out"))
    hung = sorted(set(reports) - set(waited))
    if first.get("timed_out") and hung:
        return _hang_message(hung, waited, timeout_s), ""
    callstack = failures[failed[0][1]].error_file_data["message"]["extraInfo"]["py_callstack"]
    return f"rank {failed[0][1]} failed: {first['line']}", callstack


def _ended_by_the_stop(failure: Any, stopping: bool) -> dict[str, Any] | None:
    """The report of a rank that a stop signal's default action ended while the launcher stopped the run (it was still
    starting, without a handler of its own: torch's agent ends the others with SIGTERM), else None."""
    if stopping and -failure.exitcode in rank_main.STOP_SIGNALS:
        return {"kind": "stopped", "line": f"stopped by {signal.Signals(-failure.exitcode).name}", "time": 0.0, "timed_out": False}
    return None


def _ranks(group: list[int]) -> str:
    return f"rank{'s' if len(group) > 1 else ''} {', '.join(map(str, group))}"


def _hang_message(hung: list[int], waited: list[int], timeout_s: float) -> str:
    they, were = ("they", "were") if len(hung) > 1 else ("it", "was")
    return (
        f"{_ranks(hung)} hung: {they} did not reach the collective that {_ranks(waited)} waited in for {timeout_s:g} s "
        f"(the process-group timeout); stopped every rank. Look at what {they} {were} doing: a stuck data loader, "
        "a slow or dead filesystem, or code that only some ranks run"
    )
