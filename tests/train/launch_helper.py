"""A tiny program that runs ``imgpipe.train.launch.launch`` with a per-rank function chosen on the command line.

Used by test_launch.py as a real subprocess: ``python launch_helper.py MODE [--nproc N] [--timeout S]``.
Prints one JSON line with rank 0's result; errors go through imgpipe's CLI-style one-line message.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import signal
import sys
import threading
import time

from imgpipe.errors import ImgpipeError, Stopped
from imgpipe.train.launch import launch
from imgpipe.train.rank import RankContext


def per_rank(ctx: RankContext, mode: str) -> dict:
    import torch
    import torch.distributed as dist

    if mode == "fail" and ctx.rank == 1:
        raise ImgpipeError("rank one cannot go on: bad shard x.rec")
    if mode == "kill" and ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang" and ctx.rank == 1:
        threading.Event().wait()  # never set: this rank hangs
    if mode == "leave":  # leave a worker process running and a line in stdout's buffer, as a careless rank would
        child = multiprocessing.get_context("fork").Process(target=threading.Event().wait, daemon=True)
        child.start()
        sys.stdout.write(f"rank {ctx.rank} left child {child.pid}\n")
    if mode == "stuck":  # a worker that stops answering (a read on a hung mount), the rank waiting for it in a C call
        worker = multiprocessing.get_context("fork").Process(target=_stop_self, daemon=True)
        worker.start()
        deadline = time.monotonic() + 60
        while open(f"/proc/{worker.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the worker did not stop itself"
            time.sleep(0.01)
        sys.stdout.write(f"rank {ctx.rank} stuck on worker {worker.pid}\n")
        sys.stdout.flush()
        libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)  # a pthread_mutex_t fits in 64 bytes
        libc.pthread_mutex_init(mutex, None)
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # never returns, and no Python code runs in this thread again
    if mode == "wait":
        # one write of the whole line: under PIPE_BUF it cannot interleave with the other rank's
        # (print writes the text and the newline separately, and the test runs unbuffered)
        sys.stdout.write(f"rank {ctx.rank} waiting\n")
        sys.stdout.flush()
        threading.Event().wait()  # never set: until the test kills the launcher
    from tqdm import tqdm

    tqdm(total=1, disable=True).close()  # as the trainer's loop makes its progress bars (tqdm's lock)
    ranks = [ctx.rank]
    if ctx.distributed:
        gathered: list = [None] * ctx.world_size
        dist.all_gather_object(gathered, (ctx.rank, os.environ["MASTER_PORT"]))
        ranks = gathered
    value = torch.tensor([float(ctx.rank + 1)])
    if ctx.distributed:
        dist.all_reduce(value)
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "source": ctx.env.source,
        "device": str(ctx.device),
        "backend": ctx.backend,
        "sum": value.item(),
        "ranks": ranks,
        "threads": torch.get_num_threads(),
    }


def _stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--nproc", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    try:
        result = launch(per_rank, args.mode, gpus=0, nproc=args.nproc, timeout_s=args.timeout, grace_s=5.0)
    except ImgpipeError as e:
        print(f"imgpipe: error: {e}", file=sys.stderr)
        sys.exit(1)
    except Stopped as e:
        print(f"imgpipe: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
