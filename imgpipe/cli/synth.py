"""``imgpipe synth DIR``: write the deterministic synthetic ImageNet-shaped dataset."""

from __future__ import annotations

from pathlib import Path

import click

from imgpipe.cli import cli


@cli.command("synth")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--classes", default=10, show_default=True, type=click.IntRange(min=1), help="Number of classes.")
@click.option("--per-class", default=50, show_default=True, type=click.IntRange(min=0), help="Train images per class.")
@click.option("--val-per-class", default=10, show_default=True, type=click.IntRange(min=0), help="Val images per class.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed: the same arguments give the same bytes.")
@click.option(
    "--quirks", is_flag=True, help="Add CMYK, grayscale, PNG-named-.JPEG, EXIF-rotated, truncated, empty and non-image files to train."
)
@click.option("--min-side", default=300, show_default=True, type=click.IntRange(min=8), help="Smallest side of ordinary images (px).")
@click.option("--max-side", default=500, show_default=True, type=click.IntRange(min=8), help="Largest side of ordinary images (px).")
@click.option("--tars", is_flag=True, help="Write image-net.org's three files (train tar, val tar, devkit) instead of folders.")
@click.option(
    "--layout",
    type=click.Choice(["tree", "tarballs", "split-tar", "hf-parquet", "hf-tar", "wds", "kaggle-zip"]),
    default="tree",
    show_default=True,
    help="Write the same images as a publisher ships them: image-net.org's tars (whole or split), "
    "Hugging Face's Parquet or tar.gz, timm's WebDataset shards, Kaggle's zip.",
)
@click.option(
    "--from",
    "source",
    type=click.Path(path_type=Path),
    default=None,
    help="With --layout: write this tree, made by imgpipe synth with the same arguments, instead of making its images again.",
)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1), help="Processes generating images.")
def synth_command(
    out: Path,
    classes: int,
    per_class: int,
    val_per_class: int,
    seed: int,
    quirks: bool,
    min_side: int,
    max_side: int,
    tars: bool,
    layout: str,
    source: Path | None,
    workers: int,
) -> None:
    """Write a synthetic ImageNet-shaped tree (train/<wnid>/, flat val/ + LOC_val_solution.csv) into OUT,
    or the same images in another --layout (--tars: ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and the devkit)."""
    from imgpipe.synth.tree import make_synthetic

    summary = make_synthetic(
        out,
        classes=classes,
        per_class=per_class,
        val_per_class=val_per_class,
        seed=seed,
        quirks=quirks,
        min_side=min_side,
        max_side=max_side,
        workers=workers,
        tars=tars,
        layout=layout,
        source=source,
    )
    click.echo(summary.describe())
