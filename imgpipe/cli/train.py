"""``imgpipe train``: parse options, load the config, call :func:`imgpipe.train.run`."""

from __future__ import annotations

import sys

import click

from imgpipe.cli import cli


@cli.command("train")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (see --print-config).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override one config key (repeatable).")
@click.option("--gpus", type=int, default=None, help="GPUs to use: N>1 starts N ranks here; 0 = CPU only. Default: all of CUDA if present, one rank.")
@click.option("--nproc", type=int, default=None, help="CPU ranks to start here (with --gpus 0).")
@click.option("--resume", is_flag=True, help="Continue from <output.dir>/checkpoint.pt (same as --set output.resume=yes).")
@click.option(
    "--overwrite", is_flag=True,
    help="Start afresh in an output.dir that holds a run: delete its checkpoint, metrics and TensorBoard events (same as --set output.overwrite=true).",
)
@click.option("--print-config", is_flag=True, help="Print the resolved config (the defaults without --config) as YAML and exit.")
def train_command(config_path: str | None, overrides: tuple[str, ...], gpus: int | None, nproc: int | None, resume: bool, overwrite: bool, print_config: bool) -> None:
    """Train a torchvision model on packed shards with DDP (however it is launched)."""
    from imgpipe.train import load_config, run

    items = list(overrides) + (["output.resume=yes"] if resume else []) + (["output.overwrite=true"] if overwrite else [])
    config = load_config(config_path, items)
    if print_config:
        click.echo(config.to_yaml(), nl=False)
        return
    if not config_path and not overrides:
        raise click.UsageError("give --config FILE (or --set data.path=DIR ...); --print-config shows every key")
    result = run(config, gpus=gpus, nproc=nproc)
    if result is None:  # a non-zero rank under torchrun/SLURM
        return
    if result.stopped_by:
        click.echo(f"imgpipe: stopped by {result.stopped_by} at step {result.step}; checkpoint {result.checkpoint}; continue with --resume", err=True)
        sys.exit(143 if result.stopped_by == "SIGTERM" else 130)
    summary = f"done: {result.epochs_completed} epoch(s), {result.step} steps"
    if result.images_per_s:
        summary += f", {result.images_per_s:.1f} images/s"
    if result.val_top1 is not None:
        summary += f", val top-1 {result.val_top1:.4f} top-{result.topk} {result.val_topk:.4f} over {result.val_samples} samples"
    click.echo(f"{summary}; outputs in {result.output_dir}")
