"""``imgpipe train``: parse options, load the config, call :func:`imgpipe.train.run`."""

from __future__ import annotations

import sys
from typing import Any

import click

from imgpipe.cli import cli


@cli.command("train")
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (see --print-config); over --recipe, key by key."
)
@click.option("--recipe", default=None, metavar="NAME", help="Start from a shipped recipe (see --list-recipes), e.g. rn50-16ep.")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override one config key (repeatable); over --config and --recipe.",
)
@click.option(
    "--gpus", type=int, default=None, help="GPUs to use: N>1 starts N ranks here; 0 = CPU only. Default: all of CUDA if present, one rank."
)
@click.option("--nproc", type=int, default=None, help="CPU ranks to start here (with --gpus 0).")
@click.option("--resume", is_flag=True, help="Continue from <output.dir>/checkpoint.pt (same as --set output.resume=true).")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Start afresh in an output.dir that holds a run: delete its checkpoint, metrics and "
    "TensorBoard events (same as --set output.overwrite=true).",
)
@click.option("--print-config", is_flag=True, help="Print the resolved config (the defaults without --config) as YAML and exit.")
@click.option("--list-recipes", is_flag=True, help="Name the shipped recipes and exit.")
def train_command(
    config_path: str | None,
    recipe: str | None,
    overrides: tuple[str, ...],
    gpus: int | None,
    nproc: int | None,
    resume: bool,
    overwrite: bool,
    print_config: bool,
    list_recipes: bool,
) -> None:
    """Train a torchvision (or timm:NAME) model on packed shards with DDP (however it is launched)."""
    from imgpipe.cli.stopping import STOP_GRACE_S, command_stops_within
    from imgpipe.train import load_config, run
    from imgpipe.train.launch import DEFAULT_GRACE_S

    if list_recipes:
        from imgpipe.train.recipe import describe_recipes

        click.echo("\n".join(describe_recipes()))
        return
    items = list(overrides) + (["output.resume=true"] if resume else []) + (["output.overwrite=true"] if overwrite else [])
    config = load_config(config_path, items, recipe=recipe)
    if print_config:
        click.echo(config.to_yaml(), nl=False)
        return
    if not config_path and not overrides and not recipe:
        raise click.UsageError("give --config FILE or --recipe NAME (and --set data.path=DIR ...); --print-config shows every key")
    command_stops_within(DEFAULT_GRACE_S + STOP_GRACE_S)  # the ranks' grace, then the launcher's
    result = run(config, gpus=gpus, nproc=nproc)
    if result is None:  # a non-zero rank under torchrun/SLURM
        return
    if result.stopped_by:
        click.echo(
            f"imgpipe: stopped by {result.stopped_by} at step {result.step}; checkpoint {result.checkpoint}; continue with --resume",
            err=True,
        )
        sys.exit(143 if result.stopped_by == "SIGTERM" else 130)
    click.echo(f"{summary_line(result, config.train.target_top1)}; outputs in {result.output_dir}")


def summary_line(result: Any, target: float | None) -> str:
    """The final line: epochs, steps, speed, the last validation, the wall time, and when the target top-1 was reached."""
    summary = f"done: {result.epochs_completed} epoch(s), {result.step} steps in {result.wall_s:.1f} s"
    if result.images_per_s:
        summary += f", {result.images_per_s:.1f} images/s"
    if result.val_top1 is not None:
        summary += f", val top-1 {result.val_top1:.4f} top-{result.topk} {result.val_topk:.4f} over {result.val_samples} samples"
    if result.ema_val_top1 is not None:
        summary += f", EMA val top-1 {result.ema_val_top1:.4f}"
    if result.target is not None:
        reached = result.target
        summary += f"; target top-1 {target:.4f} reached at epoch {reached['epoch']} after {reached['wall_s']:.1f} s"
    elif target is not None:
        summary += f"; target top-1 {target:.4f} not reached"
    return summary
