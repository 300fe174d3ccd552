"""A real CUDA illegal memory access, for the ``illegal-address`` hook on a GPU: a Triton kernel stores 4 TiB past its tensor."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_far_past(pointer):
    tl.store(pointer + (1 << 40), 1.0)


def illegal_memory_access(device: torch.device) -> None:
    """Fault on ``device`` as a kernel reading or writing out of bounds does: torch raises CUDA's sticky error at the sync."""
    _store_far_past[(1,)](torch.zeros(1, device=device))
    torch.cuda.synchronize(device)
    raise AssertionError(f"a store 4 TiB past a tensor did not fault on {device}")
