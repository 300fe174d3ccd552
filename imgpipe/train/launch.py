"""Run a per-rank function however the user started imgpipe: alone, under torchrun or SLURM, or as N local ranks.

``launch(fn, arg, gpus=..., nproc=...)`` runs ``fn(ctx, arg)`` (ctx a :class:`~imgpipe.train.rank.RankContext`)
in this process as its rank under torchrun or SLURM; for ``gpus=N``, or ``gpus=0, nproc=N`` (N > 1),
starts N ranks here (:mod:`imgpipe.train.local_ranks`); otherwise runs one process and no process group,
as from an IDE or a debugger. A launcher environment set by half (RANK without WORLD_SIZE) is one line
saying how to start.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, TypeVar

from imgpipe.distenv import DistEnv
from imgpipe.errors import DistributedError
from imgpipe.train.rank import DEFAULT_TIMEOUT_S, RankContext, run_rank

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_GRACE_S = 30.0
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")


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
    grace_s: how long ranks asked to stop by a signal get before they are killed.
    ``fn`` must be a module-level function and ``arg`` picklable (local ranks are started with spawn).
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
    from imgpipe.train.local_ranks import start_local_ranks

    return start_local_ranks(fn, arg, ranks, use_cuda=use_cuda, backend=backend, timeout_s=timeout_s, grace_s=grace_s)


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
