"""``imgpipe bench``: parse options, run :func:`imgpipe.bench.bench`, print the table and the verdict."""

from __future__ import annotations

import click

from imgpipe.cli import cli
from imgpipe.errors import ConfigError


def _counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--workers takes counts separated by commas, e.g. 1,2,4 (got {text!r})") from None
    if not values:
        raise ConfigError("--workers needs at least one count, e.g. 2 or 1,2,4")
    return values


@cli.command("bench")
@click.argument("data")
@click.option("--split", default="train", show_default=True, help="Split of DATA to read.")
@click.option("--gpus", type=int, default=None, help="GPU ranks to start (one per GPU). Default: every GPU torch sees, or 0 without CUDA.")
@click.option("--nproc", type=int, default=1, show_default=True, help="CPU ranks to start with --gpus 0.")
@click.option("--backend", type=click.Choice(["torch", "dali", "all"]), default="torch", show_default=True, help="Loader(s) to measure.")
@click.option(
    "--workers",
    default=None,
    help="Loader worker counts to sweep, e.g. 1,2,4; the best is reported per backend. Default: the loaders' default for this many ranks.",
)
@click.option("--steps", type=int, default=30, show_default=True, help="Measured steps per rank and run (after --warmup).")
@click.option("--warmup", type=int, default=3, show_default=True, help="Steps run first and not measured (worker start-up).")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Images per batch per rank.")
@click.option(
    "--image-size",
    type=int,
    default=None,
    help="Training crop size. Default: the size the trainer config (--config, --recipe) trains its first epoch at, else 224.",
)
@click.option("--model", default=None, help="torchvision model to run forward+backward on each batch (e.g. resnet50).")
@click.option(
    "--compute-ms", type=float, default=0.0, show_default=True, help="Simulated compute per step instead of --model (0: loader only)."
)
@click.option("--cold", is_flag=True, help="Evict DATA's shards from the page cache before each run, so the disk is measured.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the read order and augmentations.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Trainer YAML config (imgpipe train --config): the model and loaders run with its options "
    "(train.amp, train.channels_last, ...); the bench's own options win.",
)
@click.option(
    "--recipe",
    default=None,
    metavar="NAME",
    help="Trainer recipe (imgpipe train --list-recipes), under --config and --set: its options, training size and model "
    "(unless --model or --compute-ms).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override one trainer config key, as imgpipe train --set (repeatable).",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the results as JSON (schema: docs/bench-json.md).")
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), help="Write per-rank timelines and throughput as a PNG (needs imgpipe[plot])."
)
def bench_command(
    data: str,
    split: str,
    gpus: int | None,
    nproc: int,
    backend: str,
    workers: str | None,
    steps: int,
    warmup: int,
    batch_size: int,
    image_size: int | None,
    model: str | None,
    compute_ms: float,
    cold: bool,
    seed: int,
    config_path: str | None,
    recipe: str | None,
    overrides: tuple[str, ...],
    json_path: str | None,
    plot_path: str | None,
) -> None:
    """Find the bottleneck of loading DATA (a folder made by `imgpipe pack`, or its URL), rank by rank, and say what to change."""
    from imgpipe.bench import BenchConfig, bench
    from imgpipe.bench.report import check_output_path, format_report, require_matplotlib, to_dict, write_json, write_plot
    from imgpipe.bench.runner import resolve_backends
    from imgpipe.cli.stopping import STOP_GRACE_S, command_stops_within
    from imgpipe.train.launch import DEFAULT_GRACE_S

    for option, path in (("--json", json_path), ("--plot", plot_path)):
        if path:
            check_output_path(option, path)
    if plot_path:
        require_matplotlib()

    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if workers is None:
        from imgpipe.loaders.common import default_workers

        counts: tuple[int, ...] = (default_workers(gpus or nproc),)
    else:
        counts = _counts(workers)
    config = BenchConfig(
        data=data,
        split=split,
        gpus=gpus,
        nproc=nproc,
        backends=resolve_backends(backend),
        workers=counts,
        steps=steps,
        warmup=warmup,
        batch_size=batch_size,
        image_size=image_size,
        model=model,
        compute_ms=compute_ms,
        cold=cold,
        seed=seed,
        train_config_path=config_path,
        train_overrides=tuple(overrides),
        train_recipe=recipe,
    ).with_trainer_model()
    command_stops_within(DEFAULT_GRACE_S + STOP_GRACE_S)  # ranks started here: their grace, then the launcher's
    outcome = bench(config)
    if outcome is None:  # a non-zero rank under torchrun/SLURM: rank 0 reports
        return
    result, verdict = outcome
    click.echo(format_report(result, verdict))
    if json_path:
        click.echo(f"json: {write_json(json_path, to_dict(result, verdict))}")
    if plot_path:
        click.echo(f"plot: {write_plot(plot_path, result, verdict)}")
