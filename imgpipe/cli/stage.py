"""``imgpipe stage``: parse options, call :func:`imgpipe.staging.stager.stage`, print its summary."""

from __future__ import annotations

import signal
import sys

import click

from imgpipe.cli import cli
from imgpipe.errors import Stopped


@cli.command("stage")
@click.argument("src")
@click.argument("dst")
@click.option(
    "--jobs",
    type=int,
    default=None,
    help="16 MiB ranges copied at once, across files (default: 16). Uploads go 4 files at a time, each in parallel parts.",
)
@click.option("--overwrite", is_flag=True, help="Replace a DST that holds another dataset.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def stage_command(src: str, dst: str, jobs: int | None, overwrite: bool, no_progress: bool) -> None:
    """Copy the packed folder SRC to DST, every file checked against the manifest's sha256, the manifest last.

    SRC and DST are local (or mounted) folders or URLs (s3://, gs://, az://; SRC also http(s)://):
    a bucket to a node's disk, a shared mount to a node's disk, or a pack up to a bucket. A rerun
    resumes; several processes staging to one local DST end with one copy.
    """
    from imgpipe.staging.stager import DEFAULT_JOBS, stage

    try:
        report = stage(
            src, dst, jobs=DEFAULT_JOBS if jobs is None else jobs, overwrite=overwrite, progress=not no_progress and sys.stderr.isatty()
        )
    except (KeyboardInterrupt, Stopped) as e:
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        raise Stopped(signum, "rerun the same command to resume; the files verified in DST are kept") from None
    click.echo(report.summary())
