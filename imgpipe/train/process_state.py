"""What a training run changes in its process, and gives back when it ends.

``train.run()`` may run the loop in the caller's own process (one rank, no launcher), so
everything it sets there is scoped: the stop handlers for SIGTERM/SIGINT and their flag,
warning filters, ``train.deterministic``'s torch flags and ``CUBLAS_WORKSPACE_CONFIG``, the
cudnn flags, and the log level of non-zero ranks. Seeding the RNGs is the run's purpose and
is not undone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Any, Iterator

import torch

from imgpipe.train.stopping import stop_handlers

CUBLAS_WORKSPACE = ":4096:8"  # what cuBLAS needs to be deterministic (CUDA >= 10.2)


@contextlib.contextmanager
def run_scope(*, deterministic: bool, device: torch.device, is_main: bool) -> Iterator[None]:
    """Everything one rank's run sets in its process, for the duration of the block."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(stop_handlers())
        stack.enter_context(warnings.catch_warnings())
        stack.enter_context(torch_settings(deterministic, device))
        if not is_main:  # only rank 0 logs; other ranks' failures reach the launcher as one line
            stack.enter_context(_log_level(logging.getLogger("imgpipe"), logging.ERROR))
        yield


@contextlib.contextmanager
def torch_settings(deterministic: bool, device: torch.device) -> Iterator[None]:
    """Deterministic algorithms (and cuBLAS's workspace for them), or cudnn.benchmark on CUDA; the previous settings after."""
    cudnn = torch.backends.cudnn
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.benchmark,
        cudnn.deterministic,
    )
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
            torch.use_deterministic_algorithms(True)
            cudnn.benchmark = False
        elif device.type == "cuda":
            cudnn.benchmark = True
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        cudnn.benchmark, cudnn.deterministic = saved[2], saved[3]
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


@contextlib.contextmanager
def _log_level(log: logging.Logger, level: int) -> Iterator[Any]:
    previous = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(previous)
