"""Run a per-rank function however the user started imgpipe: alone, under torchrun/SLURM, or N local ranks.

``launch(fn, arg, gpus=..., nproc=...)`` decides:

- under torchrun or SLURM (their variables are set): run ``fn`` in this process as that rank;
- ``gpus=N`` (N > 1), or ``gpus=0, nproc=N`` (N > 1): start N ranks itself (``spawn``), with
  MASTER_ADDR=127.0.0.1, a free port, RANK/WORLD_SIZE/LOCAL_RANK set (CPU ranks share the cores:
  :func:`cpu_threads`), and watch them: when one
  exits non-zero the others are stopped (SIGTERM, then SIGKILL after a grace period) and a
  DistributedError names the rank; when the others timed out in a collective, it names the rank
  that never reached it (still running, silent). Every rank dies with its parent (``die_with_parent``);
- otherwise: one process and no process group (works inside an IDE debugger).

Each rank binds its CUDA device before anything else touches CUDA, then joins the process group
(nccl on GPUs, gloo on the CPU) with an explicit timeout, and always leaves it again.
``fn(ctx, arg)`` receives a :class:`RankContext`. SIGTERM or Ctrl-C to the parent is forwarded
to every rank; a loop run inside :func:`stop_handlers` turns it into a flag
(:func:`stop_requested`) so it can checkpoint and stop; other code (a rank still starting) just
dies of it, and ``launch`` raises ``Stopped`` (exit code 143 or 130), not a rank failure.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from tqdm import tqdm

from imgpipe._sys.distenv import DistEnv, available_cpus
from imgpipe._sys.procs import die_with_parent
from imgpipe.errors import DistributedError, ImgpipeError, Stopped

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_GRACE_S = 30.0
FAILURE_GRACE_S = 10.0
SETTLE_S = 1.0
HANG_SETTLE_S = 5.0  # the healthy ranks of a hung job time out a moment apart: wait for them all to report
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")
TIMEOUT_WORDS = ("timed out", "timeout")
PEER_FAILURE_WORDS = ("connection closed", "connection reset", "broken pipe", "socket", "nccl", *TIMEOUT_WORDS)

_stop_signal: int | None = None


@dataclass(frozen=True)
class RankContext:
    """What one rank needs to know: who it is, its device, and how the group was made."""

    env: DistEnv
    device: Any  # torch.device
    backend: str | None  # None when there is no process group (one process)
    timeout_s: float

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def stop_requested() -> int | None:
    """The signal (SIGTERM/SIGINT) that asked this rank to stop, or None; see :func:`stop_handlers`."""
    return _stop_signal


@contextlib.contextmanager
def stop_handlers() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT set a flag (:func:`stop_requested`) that the training loop checks;
    a second Ctrl-C raises KeyboardInterrupt. The flag starts clear; the previous handlers come back after."""
    global _stop_signal

    def _note(signum: int, _frame: object) -> None:
        global _stop_signal
        if _stop_signal is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
            return  # keep the first: a Ctrl-C reaches the ranks before the SIGTERM the launcher forwards
        _stop_signal = signum
        logger.debug("rank got %s; stopping at the next step", signal.Signals(signum).name)

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    _stop_signal = None
    try:
        for signum in previous:
            signal.signal(signum, _note)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        _stop_signal = None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and ask)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launch(
    fn: Callable[[RankContext, Any], T],
    arg: Any,
    *,
    gpus: int | None = None,
    nproc: int | None = None,
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    grace_s: float = DEFAULT_GRACE_S,
) -> T:
    """Run ``fn(ctx, arg)`` on every rank and return what it returned on rank 0 (or on this rank).

    gpus: None = use CUDA when available; 0 = CPU only; N = N GPUs (N > 1 starts N local ranks).
    nproc: local ranks to start (CPU ranks with gpus=0, one GPU each otherwise); must equal gpus when both are given.
    backend: "nccl" / "gloo"; default nccl on GPUs, gloo on the CPU.
    timeout_s: process-group timeout: a rank stuck this long in a collective fails.
    grace_s: how long stopped ranks get between SIGTERM and SIGKILL.
    ``fn`` must be a module-level function and ``arg`` picklable (ranks are started with spawn).
    """
    if gpus is not None and gpus < 0:
        raise DistributedError(f"--gpus must be >= 0, got {gpus}")
    if nproc is not None and nproc < 1:
        raise DistributedError(f"--nproc must be >= 1, got {nproc}")
    if gpus and nproc and nproc != gpus:
        raise DistributedError(f"--nproc {nproc} differs from --gpus {gpus}: one rank per GPU; give only --gpus")
    check_launcher_env(os.environ)
    env = DistEnv.detect()
    use_cuda = _want_cuda(gpus)
    if env.source in ("torchrun", "slurm"):
        if (gpus or 0) > 1 or (nproc or 0) > 1:
            logger.warning("started by %s: its %d ranks are used; --gpus/--nproc are ignored", env.source, env.world_size)
        return run_rank(fn, arg, env, use_cuda=use_cuda, backend=backend, timeout_s=timeout_s)
    ranks = gpus if gpus else (nproc or 1)
    if use_cuda:
        _check_gpu_count(ranks)
    if ranks == 1:
        return run_rank(fn, arg, env, use_cuda=use_cuda, backend=backend, timeout_s=timeout_s)
    return _spawn(fn, arg, ranks, use_cuda=use_cuda, backend=backend, timeout_s=timeout_s, grace_s=grace_s)


def check_launcher_env(environ: Any) -> None:
    """Refuse a half-set launcher environment with one line instead of a KeyError later."""
    has = {name for name in LAUNCHER_VARS if environ.get(name)}
    torchrun = {"RANK", "WORLD_SIZE"}
    if has & {"RANK", "WORLD_SIZE", "LOCAL_RANK"} and not torchrun <= has and not {"SLURM_PROCID", "SLURM_NTASKS"} <= has:
        missing = sorted(torchrun - has)
        raise DistributedError(
            f"{', '.join(sorted(has & {'RANK', 'WORLD_SIZE', 'LOCAL_RANK'}))} set but {', '.join(missing)} not: "
            "start with torchrun (or --gpus N / --nproc N), or unset these variables to run one process"
        )


def run_rank(fn: Callable[[RankContext, Any], T], arg: Any, env: DistEnv, *, use_cuda: bool, backend: str | None, timeout_s: float) -> T:
    """Bind the device, join the process group (when world > 1), run ``fn``, always leave the group."""
    device = bind_device(env, use_cuda)
    group_backend = init_process_group(env, device, backend, timeout_s) if env.world_size > 1 else None
    try:
        return fn(RankContext(env, device, group_backend, timeout_s), arg)
    finally:
        destroy_process_group()


def bind_device(env: DistEnv, use_cuda: bool) -> Any:
    """``torch.cuda.set_device(local_rank)`` before anything else touches CUDA; the CPU otherwise."""
    import torch

    if not use_cuda:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if env.local_rank >= count:
        raise DistributedError(
            f"rank {env.rank} has local rank {env.local_rank} but this machine has {count} GPU(s); "
            "start at most one rank per GPU (torchrun --nproc_per_node, or --gpus N)"
        )
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)


def init_process_group(env: DistEnv, device: Any, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Join the default process group from the environment (env://); return the backend used."""
    import torch.distributed as dist

    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise DistributedError(
                f"{name} is not set for a {env.world_size}-rank job (from {env.source}); "
                "torchrun sets it; under SLURM export MASTER_ADDR=<first node> MASTER_PORT=<free port>"
            )
    chosen = backend or ("nccl" if device.type == "cuda" else "gloo")
    if chosen == "nccl" and device.type != "cuda":
        raise DistributedError("backend nccl needs GPUs; use gloo (the default on the CPU) or --gpus N")
    options: dict[str, Any] = {}
    if device.type == "cuda":
        options["device_id"] = device
    logger.debug("rank %d/%d joining %s group (timeout %.0fs)", env.rank, env.world_size, chosen, timeout_s)
    try:
        dist.init_process_group(chosen, rank=env.rank, world_size=env.world_size, timeout=datetime.timedelta(seconds=timeout_s), **options)
    except (RuntimeError, ValueError) as e:
        raise DistributedError(f"rank {env.rank} could not join the {chosen} process group: {str(e).splitlines()[0]}") from e
    return chosen


def destroy_process_group() -> None:
    """Leave the default process group if this process is in one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _want_cuda(gpus: int | None) -> bool:
    if gpus == 0:
        return False
    import torch

    available = torch.cuda.is_available()
    if gpus and not available:
        raise DistributedError(f"--gpus {gpus} asked for GPUs but CUDA is not available; use --gpus 0 --nproc N for CPU ranks")
    return available


def _check_gpu_count(ranks: int) -> None:
    import torch

    count = torch.cuda.device_count()
    if ranks > count:
        raise DistributedError(f"asked for {ranks} GPU ranks but this machine has {count} GPU(s)")


# ----------------------------------------------------------------------------- local ranks


def _spawn(
    fn: Callable[[RankContext, Any], T], arg: Any, ranks: int, *, use_cuda: bool, backend: str | None, timeout_s: float, grace_s: float
) -> T:
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs, conns = [], []
    for rank in range(ranks):
        parent_end, child_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_rank_main,
            args=(
                rank,
                ranks,
                port,
                os.getpid(),
                logging.getLogger().getEffectiveLevel(),
                fn,
                arg,
                use_cuda,
                backend,
                timeout_s,
                child_end,
            ),
            name=f"imgpipe-rank{rank}",
        )
        procs.append(proc)
        conns.append(parent_end)
    with _ForwardStopSignals(procs, grace_s) as forward:
        try:
            for proc in procs:
                if forward.signum is not None:  # a rank started now would wait for the stopped ones in the rendezvous
                    raise Stopped(forward.signum, "while the ranks were starting")
                with _sigint_ignored_by_children():
                    proc.start()
            results = _watch(procs, conns, forward, timeout_s)
        finally:
            _stop(procs, grace_s)
    return results[0]


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


def cpu_threads(ranks: int, environ: Any) -> int | None:
    """Torch threads for each of ``ranks`` CPU ranks started here: this process's CPUs shared between them,
    as torchrun's OMP_NUM_THREADS=1 and the bench share them (each rank's default, all the cores, makes
    their OpenMP threads wait on each other at every operation); None where OMP_NUM_THREADS is set."""
    if environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, available_cpus() // ranks)


def _rank_main(
    rank: int,
    world: int,
    port: int,
    parent_pid: int,
    log_level: int,
    fn: Callable,
    arg: Any,
    use_cuda: bool,
    backend: str | None,
    timeout_s: float,
    conn: Any,
) -> None:
    """Entry point of a spawned rank: die with the parent, log like it, set the torchrun variables, run, report."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # started ignoring it: see _sigint_ignored_by_children
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(parent_pid)
    # tqdm's default lock is a multiprocessing lock: under spawn a named semaphore, which the
    # os._exit below would leave to the resource tracker's "leaked semaphore" warning; one
    # rank's progress bars only need a thread lock
    tqdm.set_lock(threading.RLock())
    prefix = "imgpipe" if rank == 0 else f"imgpipe[rank {rank}]"
    logging.basicConfig(level=log_level, format=f"{prefix}: %(levelname)s: %(message)s", stream=sys.stderr)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    threads = None if use_cuda else cpu_threads(world, os.environ)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    try:
        result = run_rank(fn, arg, DistEnv.detect(), use_cuda=use_cuda, backend=backend, timeout_s=timeout_s)
    except ImgpipeError as e:
        conn.send(("error", str(e)))
        _exit_reported(e.exit_code)
    except KeyboardInterrupt:
        conn.send(("error", "interrupted"))
        _exit_reported(130)
    except Exception as e:  # a bug (traceback on stderr) or a peer's failure (one line is enough)
        line = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if not is_peer_failure(line):
            traceback.print_exc()
        conn.send(("error", line))
        _exit_reported(1)
    conn.send(("ok", result))
    _exit_reported(0)


def _exit_reported(code: int) -> None:
    """Exit a rank whose outcome the launcher already has, without the interpreter's teardown.

    C++ destructors that run at teardown (torch's and gloo's threads) aborted a finished rank
    about once in ten bench runs here ("terminate called without an active exception", exit
    -6), which turned a job that had delivered its result into a failure. So: stop this rank's
    own worker processes as multiprocessing's exit handler would, flush, and ``os._exit``.
    """
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=5)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _watch(procs: list, conns: list, forward: "_ForwardStopSignals", timeout_s: float) -> list:
    """Wait for every rank; on the first failure stop the others and raise naming the rank (the hung one, after a timeout)."""
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    pending = set(range(len(procs)))
    while pending:
        waitables = [procs[r].sentinel for r in pending] + [conns[r] for r in pending if not conns[r].closed]
        multiprocessing.connection.wait(waitables, timeout=1.0)
        _collect(procs, conns, pending, results, errors)
        failed = _failed(procs, pending, errors)
        if failed:
            settle = time.monotonic() + (
                HANG_SETTLE_S if _timed_out(failed, errors) else SETTLE_S
            )  # let the rank that caused it report too
            while pending - set(errors) and time.monotonic() < settle:
                time.sleep(0.05)
                _collect(procs, conns, pending, results, errors)
            failed = _failed(procs, pending, errors)
            hung = sorted(r for r in pending if r not in errors) if _timed_out(failed, errors) else []
            if hung:
                _stop(procs, FAILURE_GRACE_S)
                raise DistributedError(_hang_message(hung, failed, timeout_s))
            rank = _first_failure(failed, procs, errors)
            still = sorted(r for r in pending if r != rank)
            _stop(procs, FAILURE_GRACE_S)  # a peer is gone: nothing left worth saving
            message = _failure_message(rank, procs[rank].exitcode, errors.get(rank), still)
            if forward.signum is not None:  # asked to stop: ranks that had not set up their stop handling yet die of it
                raise Stopped(forward.signum, message)
            raise DistributedError(message)
        if forward.deadline is not None and time.monotonic() > forward.deadline:
            _stop(procs, 0)
    if forward.signum is not None and len(results) < len(procs):
        raise Stopped(forward.signum)
    return [results.get(r) for r in range(len(procs))]


def _collect(procs: list, conns: list, pending: set[int], results: dict[int, Any], errors: dict[int, str]) -> None:
    """Read the ranks' messages; a rank is done once it exited and its pipe is drained."""
    for rank in sorted(pending):
        conn = conns[rank]
        while not conn.closed and conn.poll():
            try:
                kind, value = conn.recv()
            except EOFError:
                conn.close()
            else:
                (results if kind == "ok" else errors)[rank] = value
        if procs[rank].exitcode is not None and (conn.closed or not conn.poll(0.05)):
            pending.discard(rank)


def _failed(procs: list, pending: set[int], errors: dict[int, str]) -> list[int]:
    return [r for r in range(len(procs)) if r in errors or (r not in pending and procs[r].exitcode != 0)]


def _first_failure(failed: list[int], procs: list, errors: dict[int, str]) -> int:
    """Prefer a rank killed by a signal, then one that failed on its own, over one that saw a peer vanish."""

    def order(rank: int) -> tuple[int, int]:
        code = procs[rank].exitcode or 0
        if code < 0:
            return (0, rank)
        return (2 if is_peer_failure(errors.get(rank, "")) else 1, rank)

    return min(failed, key=order)


def _timed_out(failed: list[int], errors: dict[int, str]) -> bool:
    """Did every failed rank time out waiting in a collective (rather than die or fail on its own)?"""
    return bool(failed) and all(any(w in errors.get(r, "").lower() for w in TIMEOUT_WORDS) for r in failed)


def _hang_message(hung: list[int], waited: list[int], timeout_s: float) -> str:
    """The hung ranks are those still running, silent, when every other rank timed out waiting for them."""

    def ranks(group: list[int]) -> str:
        return f"rank{'s' if len(group) > 1 else ''} {', '.join(map(str, group))}"

    they, were = ("they", "were") if len(hung) > 1 else ("it", "was")
    return (
        f"{ranks(hung)} hung: {they} did not reach the collective that {ranks(waited)} waited in for {timeout_s:g} s "
        f"(the process-group timeout); stopped every rank. Look at what {they} {were} doing: a stuck data loader, "
        "a slow or dead filesystem, or code that only some ranks run"
    )


def is_peer_failure(text: str) -> bool:
    """Does this error look like the consequence of another rank dying or hanging?"""
    lowered = text.lower()
    return any(w in lowered for w in PEER_FAILURE_WORDS)


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


def _stop(procs: list, grace_s: float) -> None:
    """SIGTERM every live rank, SIGKILL whatever is left after ``grace_s``, and reap them all."""
    live = [p for p in procs if p.pid is not None and p.exitcode is None]
    for p in live:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in live:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in live:
        if p.exitcode is None:
            logger.warning("rank %s did not stop within %.0fs; killing it", p.name, grace_s)
            _signal(p, signal.SIGKILL)
            p.join(5.0)


def _signal(proc: Any, signum: int) -> None:
    try:
        os.kill(proc.pid, signum)
    except ProcessLookupError:
        pass


class _ForwardStopSignals:
    """While ranks run, SIGTERM/SIGINT to the parent go to every rank; a second one kills them."""

    def __init__(self, procs: list, grace_s: float) -> None:
        self.procs = procs
        self.grace_s = grace_s
        self.signum: int | None = None
        self.deadline: float | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_ForwardStopSignals":
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is not None:
            for p in self.procs:
                if p.pid is not None and p.exitcode is None:
                    _signal(p, signal.SIGKILL)
            return
        self.signum = signum
        self.deadline = time.monotonic() + self.grace_s
        logger.warning("got %s: asking every rank to stop (send it again to kill them)", signal.Signals(signum).name)
        for p in self.procs:
            if p.pid is not None and p.exitcode is None:
                _signal(p, signal.SIGTERM)
