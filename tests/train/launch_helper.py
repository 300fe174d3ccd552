"""A tiny program that runs ``imgpipe.train.launch.launch`` with a per-rank function chosen on the command line.

Used by test_launch.py as a real subprocess: ``python launch_helper.py MODE [--nproc N] [--timeout S]``.
Prints one JSON line with rank 0's result; errors go through imgpipe's CLI-style one-line message.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import threading

from imgpipe.errors import ImgpipeError
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
    print(json.dumps(result))


if __name__ == "__main__":
    main()
