"""``imgpipe train``: a DDP trainer that runs however it is launched and says where the time goes.

``run(config, gpus=..., nproc=...)`` launches the ranks (see :mod:`imgpipe.train.launch`) and
returns rank 0's :class:`TrainResult`. Modules: config, recipe, launch (with rank, local_ranks, rank_main and
stopping), data, loop (the epoch loop), and the loop's parts: stepping (model, optimizer, EMA) with
models, optim, blurpool, ema, compiling, precision; validation; runlog (metrics.jsonl, TensorBoard)
with metrics; run_checkpoint with checkpoint_file and resume; failures; mixing; resolution.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from imgpipe.train.config import TrainConfig, default_yaml, load_config

__all__ = ["TrainConfig", "TrainResult", "default_yaml", "demo_config_path", "load_config", "run"]


def run(config: TrainConfig, *, gpus: int | None = None, nproc: int | None = None, backend: str | None = None) -> Any:
    """Train with ``config`` on the ranks that gpus/nproc or the launcher's environment give; returns a TrainResult."""
    import os
    import sys

    from imgpipe.distenv import DistEnv
    from imgpipe.train.launch import check_launcher_env, launch
    from imgpipe.train.rundir import claim_output_dir

    check_launcher_env(os.environ)
    env = DistEnv.detect()
    claim_output_dir(config, is_main=env.is_main)  # under torchrun/SLURM every rank checks, rank 0 clears
    if config.data.stage:  # once per node, before any process group: local rank 0 copies (here, for ranks this process starts)
        from imgpipe.staging.stager import stage_on_node

        stage_on_node(config.data.path, config.data.stage, local_rank=env.local_rank, progress=sys.stderr.isatty())
    return launch(_train_rank, config, gpus=gpus, nproc=nproc, backend=backend, timeout_s=config.train.timeout_s)


def _train_rank(ctx: Any, config: TrainConfig) -> Any:
    """The per-rank entry point; imports torch only in the ranks, not in a launcher that spawns them."""
    from imgpipe.train.loop import train_rank

    return train_rank(ctx, config)


def demo_config_path() -> str:
    """Path of the bundled demo config (a short 2-process CPU run; set data.path and output.dir)."""
    return str(resources.files("imgpipe.train").joinpath("demo.yaml"))


def __getattr__(name: str) -> Any:
    if name == "TrainResult":
        from imgpipe.train.loop import TrainResult

        return TrainResult
    raise AttributeError(f"module 'imgpipe.train' has no attribute {name!r}")
