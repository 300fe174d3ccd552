"""Test hooks: make one rank of a real run fail, or read slowly, the way real runs do; nothing in imgpipe reads them.

A process started with :func:`hook_env`'s environment has this folder on its PYTHONPATH, so its
``sitecustomize`` calls :func:`install`, which patches imgpipe's modules as they are imported
(in every rank and loader worker the process starts, which inherit the environment):

- ``IMGPIPE_TRAIN_FAULT_RANK<r>=KIND`` makes rank ``r``'s model, from its second forward pass on
  (the first is the trainer's size check, so one whole step and its collectives run first):
  ``hang`` (blocked, never reaching the step's all-reduce), ``oom`` (``torch.OutOfMemoryError``, as
  CUDA raises it), ``illegal-address`` (on a GPU a real illegal memory access, ``cuda_fault.py``; on the
  CPU the error torch raised for one on an H200, as recorded in ``cuda_illegal_address.json``);
  ``unused-parameter`` gives it a parameter no forward pass uses (set it on every rank: DDP refuses
  models that differ between ranks); ``short-val`` leaves out its last validation batch.
- ``IMGPIPE_PACK_GATE=FIFO`` with ``IMGPIPE_PACK_GATED=NAME`` (``gate_env``) makes a pack, once it has
  read the source file NAME, wait until the test lets it go on (``wait_at_gate``), as a read stuck on a
  slow mount would; pack reads only regular files, so a FIFO in SRC can no longer do this.
- ``IMGPIPE_BENCH_READ_DELAY_MS_RANK<r>=MS`` makes rank ``r``'s timed loader workers sleep MS ms
  on each record they read, as a slow disk would.
- ``IMGPIPE_VERIFY_HOLD=1`` makes every shard check of ``imgpipe verify`` wait forever, as on a disk
  that stopped answering: its pool's workers stay busy until they are killed.
- ``IMGPIPE_TEST_STUCK_READS=1`` stops (SIGSTOP) every torch loader worker as it reads its first batch,
  as a read on a hung mount would leave it.
- ``IMGPIPE_TEST_SIGNAL_IN_FORK=SIGNAL,WHEN`` sends this process SIGNAL from inside a fork hook of its
  first fork, where a Python handler's exception is only printed: WHEN ``early`` is a hook registered
  before the ``imgpipe`` command starts, ``late`` one registered as imgpipe.cli.commands is imported.
- ``IMGPIPE_TEST_SLOW_EXIT=MARKER,WHERE``: as imgpipe.cli.commands is imported, something that touches
  MARKER and then takes 60 s, where the process ends: WHERE ``handler`` is an exit handler (``atexit``),
  ``teardown`` an object collected in the interpreter's teardown, after the exit handlers, ``daemon`` a daemonic
  multiprocessing child (its pid in MARKER) left running, which multiprocessing's exit handler ends.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

TRAIN_FAULT_ENV = "IMGPIPE_TRAIN_FAULT_RANK{rank}"
READ_DELAY_ENV = "IMGPIPE_BENCH_READ_DELAY_MS_RANK{rank}"
VERIFY_HOLD_ENV = "IMGPIPE_VERIFY_HOLD"
STUCK_READS_ENV = "IMGPIPE_TEST_STUCK_READS"
SIGNAL_IN_FORK_ENV = "IMGPIPE_TEST_SIGNAL_IN_FORK"
SLOW_EXIT_ENV = "IMGPIPE_TEST_SLOW_EXIT"
KINDS = ("hang", "oom", "illegal-address", "unused-parameter", "short-val")
ILLEGAL_ADDRESS_RECORD = Path(__file__).resolve().with_name("cuda_illegal_address.json")
HERE = Path(__file__).resolve().parent


def hook_env(env: dict[str, str], **hooks: str) -> dict[str, str]:
    """``env`` with the hooks set (``hook_env(env, IMGPIPE_TRAIN_FAULT_RANK1="hang")``) and this folder first on PYTHONPATH."""
    path = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return {**env, **hooks, "PYTHONPATH": path}


def install() -> None:
    """Patch imgpipe's modules as they are imported, when this process's environment asks for a hook."""
    prefixes = (TRAIN_FAULT_ENV.split("{")[0], READ_DELAY_ENV.split("{")[0], VERIFY_HOLD_ENV, STUCK_READS_ENV, SIGNAL_IN_FORK_ENV)
    prefixes += (SLOW_EXIT_ENV,)
    if any(name.startswith(prefixes) for name in os.environ):
        patches = {"imgpipe.train.models": _patch_models, "imgpipe.train.data": _patch_data}
        patches["imgpipe.loaders.phase_timer"] = _patch_phase_timer
        patches["imgpipe.format.verify"] = _patch_verify
        if os.environ.get(STUCK_READS_ENV):
            patches["imgpipe.loaders.torch"] = _patch_stuck_reads
        if os.environ.get(SIGNAL_IN_FORK_ENV):
            name, when = os.environ[SIGNAL_IN_FORK_ENV].split(",")
            if when == "early":
                _signal_in_first_fork(getattr(signal, name))
            else:
                patches["imgpipe.cli.commands"] = lambda _module: _signal_in_first_fork(getattr(signal, name))
        if os.environ.get(SLOW_EXIT_ENV):
            marker, where = os.environ[SLOW_EXIT_ENV].split(",")
            patches["imgpipe.cli.commands"] = lambda _module: _slow_exit(marker, where)
        sys.meta_path.insert(0, _AfterImport(patches))
    if os.environ.get(PACK_GATE_ENV):
        sys.meta_path.insert(0, _AfterImport({"imgpipe.packing.filereads": _patch_filereads}))


PACK_GATE_ENV, PACK_GATED_ENV = "IMGPIPE_PACK_GATE", "IMGPIPE_PACK_GATED"


def gate_env(env: dict[str, str], gate: Path, name: str) -> dict[str, str]:
    """``env`` for a pack that stops after reading the source file ``name`` until ``wait_at_gate(gate)`` lets it go on;
    ``gate`` is made here, a FIFO outside SRC."""
    os.mkfifo(gate)
    return hook_env(env, **{PACK_GATE_ENV: str(gate), PACK_GATED_ENV: name})


def wait_at_gate(gate: Path, timeout: float = 60.0, process: Any = None) -> int:
    """Wait until a pack waits at ``gate`` (it has it open for reading); an fd whose close lets it go on.
    ``process`` (a Popen) that ends first fails the wait."""
    import errno

    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.open(gate, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader has the FIFO open
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the pack ended (exit {process.returncode}) before it reached {gate}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no pack reached {gate} within {timeout} s")
        time.sleep(0.01)


def _patch_filereads(filereads: Any) -> None:
    gate, name = os.environ[PACK_GATE_ENV], os.environ.get(PACK_GATED_ENV)
    read = filereads.FileReads.read

    def gated_read(self: Any) -> Iterator[Any]:
        for path, data in zip(self.paths, read(self)):
            if path.rsplit("/", 1)[-1] == name:
                with open(gate, "rb") as fifo:  # opens once the test opens it for writing, reads to its close
                    fifo.read()
            yield data

    filereads.FileReads.read = gated_read


def _patch_stuck_reads(loaders: Any) -> None:
    get_batch = loaders.BatchDataset.__getitem__

    def stuck(self: Any, request: Any) -> Any:
        if loaders.get_worker_info() is not None:  # in a loader worker
            os.kill(os.getpid(), signal.SIGSTOP)
        return get_batch(self, request)

    loaders.BatchDataset.__getitem__ = stuck


def _signal_in_first_fork(signum: int) -> None:
    """SIGNAL to this process from inside a hook that runs in the parent right after its first fork."""
    pid, sent = os.getpid(), []

    def in_parent() -> None:
        if os.getpid() == pid and not sent:
            sent.append(signum)
            signal.raise_signal(signum)  # the handler runs before raise_signal returns: inside this hook

    os.register_at_fork(after_in_parent=in_parent)


class _SlowTeardown:
    def __init__(self, marker: str) -> None:  # what __del__ needs, held here: a module's globals are gone in the teardown
        self.marker, self.open, self.close, self.sleep = marker, os.open, os.close, time.sleep
        self.flags = os.O_CREAT | os.O_WRONLY

    def __del__(self) -> None:
        self.close(self.open(self.marker, self.flags))
        self.sleep(60)  # a slow teardown: the elapsed time is what the stop must not wait for


def _slow_exit(marker: str, where: str) -> None:
    """Make the process take a minute to end, in an exit handler or in the interpreter's teardown; touch MARKER then."""
    if where == "handler":
        import atexit

        atexit.register(lambda: (Path(marker).touch(), time.sleep(60)))  # a slow exit handler: elapsed time is the point
    elif where == "daemon":
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
        child.start()
        Path(marker).write_text(str(child.pid))
    else:
        sys.modules[__name__].slow_teardown = _SlowTeardown(marker)  # collected with this module


def fault(rank: int) -> str | None:
    """The fault asked of ``rank``, or None."""
    kind = os.environ.get(TRAIN_FAULT_ENV.format(rank=rank)) or None
    if kind is not None and kind not in KINDS:
        raise ValueError(f"{TRAIN_FAULT_ENV.format(rank=rank)}={kind!r}: must be one of {', '.join(KINDS)}")
    return kind


def read_delay_s(rank: int) -> float:
    """The per-record read delay asked of ``rank`` (seconds)."""
    return max(float(os.environ.get(READ_DELAY_ENV.format(rank=rank)) or 0.0), 0.0) / 1000.0


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patches[name](module)`` right after the module ``name`` executed, before anyone imports names from it."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute, patch = spec.loader.exec_module, self.patches[name]

        def exec_module(module: Any) -> None:
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _this_rank() -> int:
    """This process's rank: the process group's, else the launcher's variables (a loader worker inherits them)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)


def _patch_models(models: Any) -> None:
    create_model = models.create_model

    def create_faulty_model(name: str, num_classes: int) -> Any:
        import torch

        model = create_model(name, num_classes)
        rank = _this_rank()
        kind = fault(rank)
        if kind == "unused-parameter":
            model.add_module("imgpipe_unused", torch.nn.Linear(1, 1))
        elif kind in ("hang", "oom", "illegal-address"):
            calls = [0]

            def before_forward(_module: Any, inputs: Any) -> None:
                calls[0] += 1
                if calls[0] < 2:
                    return
                if kind == "hang":
                    threading.Event().wait()  # never set: the rank hangs here
                if kind == "oom":
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by {TRAIN_FAULT_ENV.format(rank=rank)})"
                    )
                illegal_memory_access(inputs[0].device)

            model.register_forward_pre_hook(before_forward)
        return model

    models.create_model = create_faulty_model


class _ShortVal:
    """A validation loader less its last batch."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        previous = None
        for batch in self.loader:
            if previous is not None:
                yield previous
            previous = batch


def illegal_memory_access(device: Any) -> None:
    """A real illegal memory access on a CUDA ``device``; elsewhere (no CPU op can make one) the error torch raised for a real one."""
    if device.type == "cuda":
        from cuda_fault import illegal_memory_access as on_the_gpu

        on_the_gpu(device)
    raise recorded_illegal_memory_access()


def recorded_illegal_memory_access() -> BaseException:
    """The exception torch raised for a real illegal memory access on a GPU, its type and message as recorded there."""
    import torch

    recorded = json.loads(ILLEGAL_ADDRESS_RECORD.read_text())
    return getattr(torch, recorded["type"])(recorded["message"])


def _patch_data(data: Any) -> None:
    build_data = data.build_data

    def build_short_data(config: Any, ctx: Any) -> Any:
        built = build_data(config, ctx)
        if fault(ctx.rank) == "short-val" and built.val is not None:
            return dataclasses.replace(built, val=_ShortVal(built.val))
        return built

    data.build_data = build_short_data


def _patch_phase_timer(phase_timer: Any) -> None:
    read = phase_timer.PhaseTimer.read

    def slow_read(self: Any, records: Any, k: int) -> Any:
        item = read(self, records, k)
        delay = read_delay_s(_this_rank())
        if delay:
            time.sleep(delay)  # elapsed time is what is tested: a slow disk, found by the bench
        return item

    phase_timer.PhaseTimer.read = slow_read


def _patch_verify(verify: Any) -> None:
    check_shard = verify.check_shard

    @functools.wraps(check_shard)  # pickled by its name for the pool, and found patched there too
    def held(check: Any) -> Any:
        if os.environ.get(VERIFY_HOLD_ENV):
            threading.Event().wait()  # never set: the check is held until its process is killed
        return check_shard(check)

    verify.check_shard = held
