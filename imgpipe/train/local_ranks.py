"""N ranks on this machine (``--gpus N``, ``--nproc N``), started and watched by torch's elastic agent.

torchrun's ``LocalElasticAgent`` starts the ranks (spawn), gives them their c10d rendezvous and stops
the others when one fails. Kept here is what it lacks (docs/training.md): one line naming the rank
that died, failed or hung, not a peer that saw it vanish; ranks that die with the launcher; SIGTERM or
Ctrl-C as checkpoint-and-stop (``Stopped``), and no traceback while the ranks start; CPU ranks sharing
the cores (:func:`cpu_threads`); a finished rank that skips the interpreter's teardown (``_exit_now``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch.distributed.elastic.rendezvous.registry as rendezvous_registry
from torch.distributed.elastic.agent.server.api import WorkerGroup, WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.rendezvous import RendezvousParameters
from tqdm import tqdm

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.distenv import DistEnv, available_cpus
from imgpipe._sys.procs import die_with_parent
from imgpipe.errors import DistributedError, ImgpipeError, Stopped
from imgpipe.train.rank import RankContext, is_peer_failure, run_rank, timed_out

logger = logging.getLogger(__name__)

T = TypeVar("T")

MONITOR_S = 0.1  # how often the agent looks at the ranks
HANG_SETTLE_S = 5.0  # the healthy ranks of a hung job time out a moment apart: each lingers so that all report
ELASTIC_SIGNALS = "SIGHUP,SIGQUIT"  # elastic's handlers stop the ranks with these; SIGTERM and SIGINT are imgpipe's (stop cleanly)
ELASTIC_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing.spawn")


def start_local_ranks(
    fn: Callable[[RankContext, Any], T], arg: Any, ranks: int, *, use_cuda: bool, backend: str | None, timeout_s: float, grace_s: float
) -> T:
    """Run ``fn(ctx, arg)`` on ``ranks`` ranks started here and return rank 0's result.

    A rank that fails or dies is one DistributedError naming it (a hang: the hung ranks); when
    SIGTERM or Ctrl-C stopped the run before every rank returned, ``Stopped``.
    """
    reports = Path(tempfile.mkdtemp(prefix="imgpipe-ranks-"))
    parameters = RendezvousParameters(
        backend="c10d", endpoint="127.0.0.1:0", run_id=f"imgpipe-{uuid.uuid4().hex}", min_nodes=1, max_nodes=1, local_addr="127.0.0.1"
    )
    rendezvous = rendezvous_registry.get_rendezvous_handler(parameters)
    level = logging.getLogger().getEffectiveLevel()
    spec = WorkerSpec(
        role="imgpipe",
        local_world_size=ranks,
        entrypoint=_rank_main,
        args=(fn, arg, os.getpid(), level, use_cuda, backend, timeout_s, str(reports)),
        rdzv_handler=rendezvous,
        max_restarts=0,
        monitor_interval=MONITOR_S,
        local_addr="127.0.0.1",
    )
    stops = _ForwardStopSignals(grace_s)
    agent = _Agent(spec, stops)
    try:
        with _quiet_elastic(), _elastic_signals(), stops:
            result = agent.run()
        if not result.is_failed():
            return result.return_values[0]
        exits = {rank: failure.exitcode for rank, failure in result.failures.items()}
        message = _verdict(ranks, {**exits, **agent.ended}, _read_reports(reports), timeout_s)
    finally:
        rendezvous.shutdown()
        shutil.rmtree(reports, ignore_errors=True)
    if stops.signum is not None:  # asked to stop: ranks that had not set up their stop handling yet died of it
        raise Stopped(stops.signum, message)
    raise DistributedError(message)


class _Agent(LocalElasticAgent):
    """torchrun's agent, which also notes each rank's exit status the moment it ends (before torch reaps it) and
    starts the ranks with SIGINT ignored."""

    def __init__(self, spec: WorkerSpec, stops: _ForwardStopSignals) -> None:
        super().__init__(spec, DefaultLogsSpecs(log_dir=os.devnull), start_method="spawn")
        self.stops = stops
        self.pids: dict[int, int] = {}  # rank -> pid
        self.ended: dict[int, int] = {}  # rank -> exit code (negative: killed by that signal), as they ended

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        if self.stops.signum is not None:  # a rank started now would wait for the stopped ones in the rendezvous
            raise Stopped(self.stops.signum, "while the ranks were starting")
        with _sigint_ignored_by_children():
            pids = super()._start_workers(worker_group)
        self.pids = dict(pids)
        self.stops.watch(self)
        return pids

    def _monitor_workers(self, worker_group: WorkerGroup) -> Any:
        self._note_ended()
        self.stops.enforce_deadline()
        return super()._monitor_workers(worker_group)

    def _note_ended(self) -> None:
        """Each rank that ended since the last look, with its exit status (``waitid`` with WNOWAIT: torch still reaps it)."""
        for rank, pid in self.pids.items():
            if rank in self.ended:
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                continue
            if info is not None and info.si_pid == pid:
                self.ended[rank] = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def live_pids(self) -> list[int]:
        return [pid for rank, pid in self.pids.items() if rank not in self.ended]


class _ForwardStopSignals:
    """While the ranks run, SIGTERM/SIGINT to the launcher become SIGTERM to every rank (each checkpoints and stops);
    a second one kills them, and so does the end of ``grace_s``."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.signum: int | None = None
        self.deadline: float | None = None
        self._agent: _Agent | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _ForwardStopSignals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def watch(self, agent: _Agent) -> None:
        """The ranks exist now: forward a signal that came while they were starting."""
        self._agent = agent
        if self.signum is not None:
            self._send(signal.SIGTERM)

    def enforce_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self._send(signal.SIGKILL)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is not None:
            self._send(signal.SIGKILL)
            return
        self.signum = signum
        self.deadline = time.monotonic() + self.grace_s
        logger.warning("got %s: asking every rank to stop (send it again to kill them)", signal.Signals(signum).name)
        self._send(signal.SIGTERM)

    def _send(self, signum: int) -> None:
        for pid in self._agent.live_pids() if self._agent is not None else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


@contextlib.contextmanager
def _sigint_ignored_by_children() -> Iterator[None]:
    """Start processes that ignore SIGINT until their own code takes it back (``_rank_main``).

    A Ctrl-C in a terminal goes to the whole process group: a rank still starting its interpreter
    would die of it with a traceback from the middle of its imports. An ignored signal stays ignored
    across exec, so the rank never sees it; the launcher still does, and stops the ranks with
    SIGTERM. The launcher's own SIGINT is blocked meanwhile, so one that arrives is delivered to
    its handler afterwards instead of being lost (blocking also survives exec: ``_rank_main``
    unblocks it).
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _elastic_signals() -> Iterator[None]:
    """Elastic handles SIGHUP and SIGQUIT only (as its environment variable says); its handlers go when the ranks are done."""
    name = "TORCHELASTIC_SIGNALS_TO_HANDLE"
    before_env = os.environ.get(name)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGHUP, signal.SIGQUIT)}
    os.environ[name] = ELASTIC_SIGNALS
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if before_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before_env


@contextlib.contextmanager
def _quiet_elastic() -> Iterator[None]:
    """Elastic logs every failure with the rank's traceback, and its progress: imgpipe says what failed, in one line."""
    loggers = [logging.getLogger(name) for name in ELASTIC_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def cpu_threads(ranks: int, environ: Any) -> int | None:
    """Torch threads for each of ``ranks`` CPU ranks started here: this process's CPUs shared between them,
    as torchrun's OMP_NUM_THREADS=1 and the bench share them (each rank's default, all the cores, makes
    their OpenMP threads wait on each other at every operation); None where OMP_NUM_THREADS is set."""
    if environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, available_cpus() // ranks)


# ----------------------------------------------------------------------------- in each rank


def _rank_main(
    fn: Callable, arg: Any, parent_pid: int, log_level: int, use_cuda: bool, backend: str | None, timeout_s: float, reports: str
) -> Any:
    """A rank's entry point (elastic set its RANK, WORLD_SIZE, ...): die with the launcher, log like it, run ``fn``;
    a failure is reported in ``reports`` and ends the process, a result goes back to the agent."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # started ignoring it: see _sigint_ignored_by_children
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(parent_pid)
    # tqdm's default lock is a multiprocessing lock: under spawn a named semaphore, which the
    # os._exit below would leave to the resource tracker's "leaked semaphore" warning; one
    # rank's progress bars only need a thread lock
    tqdm.set_lock(threading.RLock())
    env = DistEnv.detect()
    prefix = "imgpipe" if env.rank == 0 else f"imgpipe[rank {env.rank}]"
    logging.basicConfig(level=log_level, format=f"{prefix}: %(levelname)s: %(message)s", stream=sys.stderr)
    threads = None if use_cuda else cpu_threads(env.world_size, os.environ)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    report = Path(reports) / f"{env.rank}.json"
    try:
        result = run_rank(fn, arg, env, use_cuda=use_cuda, backend=backend, timeout_s=timeout_s)
        pickle.dumps(result)  # the agent's queue pickles it: a result that cannot go is this rank's failure, not a hang
    except ImgpipeError as e:
        _exit_reported(report, str(e), e.exit_code)
    except KeyboardInterrupt:
        _exit_reported(report, "interrupted", 130)
    except Exception as e:  # a bug (traceback on stderr) or a peer's failure (one line is enough)
        line = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if not is_peer_failure(line):
            traceback.print_exc()
        _exit_reported(report, line, 1)
    _stop_children()
    atexit.register(_exit_now, 0)  # after the agent took the result: no teardown
    return result


def _exit_reported(report: Path, line: str, code: int) -> None:
    """Write this rank's one-line failure for the launcher and exit ``code``, without the teardown.

    A rank that timed out in a collective lingers first (HANG_SETTLE_S), so that the others that time
    out too report it before the agent stops them: the hung ranks are then those that never reported.
    """
    atomic_write_bytes(report, json.dumps({"error": line}).encode())
    if timed_out(line):
        time.sleep(HANG_SETTLE_S)
    _stop_children()
    _exit_now(code)


def _stop_children() -> None:
    """Stop this rank's own worker processes, as multiprocessing's exit handler would (which ``os._exit`` skips)."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=5)


def _exit_now(code: int) -> None:
    """``os._exit``, the logs and the output flushed: no interpreter teardown, where torch's and gloo's threads can
    abort a rank that has delivered its result ("terminate called without an active exception")."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


# ----------------------------------------------------------------------------- the verdict


def _read_reports(folder: Path) -> dict[int, str]:
    """rank -> its one-line failure."""
    found = {}
    for path in folder.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            found[int(path.stem)] = json.loads(path.read_text())["error"]
    return found


def _verdict(ranks: int, ended: dict[int, int], errors: dict[int, str], timeout_s: float) -> str:
    """The one line: the hung ranks, or the rank that caused the failure.

    ``ended``: the exit codes of the ranks that ended before the agent stopped the others, in the order
    they were seen; ``errors``: every rank's reported failure.
    """
    failed = [r for r in range(ranks) if r in errors or ended.get(r, 0) != 0]
    if failed and all(timed_out(errors.get(r, "")) for r in failed):
        hung = [r for r in range(ranks) if r not in errors and r not in ended]
        if hung:
            return _hang_message(hung, failed, timeout_s)
    rank = _first_failure(failed or list(ended) or [0], ended, errors)
    running = [r for r in range(ranks) if r != rank and r not in ended]
    return _failure_message(rank, ended.get(rank), errors.get(rank), running)


def _first_failure(failed: list[int], ended: dict[int, int], errors: dict[int, str]) -> int:
    """Prefer a rank killed by a signal, then one that failed on its own, over one that saw a peer vanish."""

    def order(rank: int) -> tuple[int, int]:
        if ended.get(rank, 0) < 0 and rank not in errors:
            return (0, rank)
        return (2 if is_peer_failure(errors.get(rank, "")) else 1, rank)

    return min(failed, key=order)


def _hang_message(hung: list[int], waited: list[int], timeout_s: float) -> str:
    """The hung ranks are those that never reported, when every rank that did timed out waiting for them."""

    def ranks(group: list[int]) -> str:
        return f"rank{'s' if len(group) > 1 else ''} {', '.join(map(str, group))}"

    they, were = ("they", "were") if len(hung) > 1 else ("it", "was")
    return (
        f"{ranks(hung)} hung: {they} did not reach the collective that {ranks(waited)} waited in for {timeout_s:g} s "
        f"(the process-group timeout); stopped every rank. Look at what {they} {were} doing: a stuck data loader, "
        "a slow or dead filesystem, or code that only some ranks run"
    )


def _failure_message(rank: int, code: int | None, error: str | None, still_running: list[int]) -> str:
    if error:
        what = f"rank {rank} failed: {error}"
    elif code is not None and code < 0:
        what = f"rank {rank} exited with code {code} (killed by {signal.Signals(-code).name})"
    else:
        what = f"rank {rank} exited with code {code}"
    if still_running:
        what += f"; stopped the other ranks ({', '.join(map(str, still_running))})"
    return what
