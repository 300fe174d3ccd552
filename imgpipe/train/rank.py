"""One rank of a run: who it is (:class:`RankContext`), its device, and its process group.

Each rank binds its CUDA device before anything else touches CUDA, then joins the process group
(nccl on GPUs, gloo on the CPU) from the environment (env://) with an explicit timeout, runs, and
always leaves the group again.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from imgpipe.distenv import DistEnv
from imgpipe.errors import DistributedError

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 1800.0
TIMEOUT_WORDS = ("timed out", "timeout")
PEER_FAILURE_WORDS = ("connection closed", "connection reset", "broken pipe", "socket", "nccl", *TIMEOUT_WORDS)


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


def is_peer_failure(text: str) -> bool:
    """Does this error look like the consequence of another rank dying or hanging?"""
    lowered = text.lower()
    return any(w in lowered for w in PEER_FAILURE_WORDS)


def timed_out(text: str) -> bool:
    """Does this error say a collective (or the group's start) waited out the process-group timeout?"""
    lowered = text.lower()
    return any(w in lowered for w in TIMEOUT_WORDS)
