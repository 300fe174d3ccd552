"""imgpipe's own one-line messages for the failures torch reports at length, or misleadingly, inside a rank.

CUDA out of memory (with the batch size, the memory and what to change), CUDA's illegal memory
access (a kernel or indexing bug, not an out-of-memory), an op without a deterministic kernel under
``train.deterministic``, DDP's unused parameters, and a peer that died or hung.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from imgpipe.errors import DistributedError, ImgpipeError, TrainError
from imgpipe.train.config import TrainConfig
from imgpipe.train.rank import is_peer_failure

if TYPE_CHECKING:
    from imgpipe.train.rank import RankContext

NONDETERMINISTIC_TEXT = "does not have a deterministic implementation"
UNUSED_PARAMS_TEXT = "Expected to have finished reduction in the prior iteration"


def explain_failure(error: BaseException, ctx: RankContext, config: TrainConfig) -> ImgpipeError | None:
    """The one-line error for ``error``, or None when imgpipe has nothing to add to it.

    A peer's failure is what the healthy ranks see under torchrun or SLURM, where no imgpipe launcher
    watches the ranks (with --gpus/--nproc, the launcher names the failed or hung rank itself).
    """
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return TrainError(_oom_message(ctx, config))
    text = str(error)
    if "illegal memory access" in text:
        return TrainError(
            f"rank {ctx.rank}: CUDA error 'illegal memory access' in model {config.model.name}: a sticky error (this process "
            "cannot use the GPU again), usually a kernel reading out of bounds, such as a label >= the model's classes or "
            "a bug in a custom op, not an out-of-memory; check that labels are below model.num_classes and rerun with "
            "CUDA_LAUNCH_BLOCKING=1 to see the failing op"
        )
    if NONDETERMINISTIC_TEXT in text:
        op = (text.split(NONDETERMINISTIC_TEXT)[0].split() or ["unnamed"])[-1]
        return TrainError(
            f"rank {ctx.rank}: train.deterministic: true, but model {config.model.name} runs an op without a deterministic "
            f"kernel on {ctx.device.type} ({op}); set train.deterministic: false, or choose another model"
        )
    if UNUSED_PARAMS_TEXT in text:
        return TrainError(
            f"DDP found parameters of model {config.model.name!r} that got no gradient in a step: set "
            "train.find_unused_parameters: true (slower), or make every output of the model take part in the loss"
        )
    if ctx.distributed and is_peer_failure(text):
        return DistributedError(
            f"rank {ctx.rank}: {type(error).__name__}: {text.splitlines()[0]}; another rank died, or hung for the process-group "
            f"timeout ({ctx.timeout_s:g} s, train.timeout_s): the other ranks' output names the cause"
        )
    return None


def _oom_message(ctx: RankContext, config: TrainConfig) -> str:
    memory = ""
    if ctx.device.type == "cuda":
        with contextlib.suppress(Exception):
            free, total = torch.cuda.mem_get_info(ctx.device)
            peak = torch.cuda.max_memory_allocated(ctx.device)
            memory = f"; peak allocated {peak / 2**30:.1f} GiB, free {free / 2**30:.1f} of {total / 2**30:.1f} GiB"
    return (
        f"rank {ctx.rank}: CUDA out of memory with train.batch_size={config.train.batch_size} per process, model {config.model.name}, "
        f"image_size {config.data.image_size}, amp {config.train.amp}{memory}; lower train.batch_size (keep the global batch "
        f"with train.grad_accum), use train.amp: bf16, and check that no other process holds this GPU (nvidia-smi)"
    )
