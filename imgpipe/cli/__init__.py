"""The ``imgpipe`` command: a thin click layer; each sub-module registers one command family."""

from __future__ import annotations

import logging
import signal
import sys

import click

from imgpipe.errors import ImgpipeError, Stopped


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
def cli(verbose: bool) -> None:
    """imgpipe: pack ImageNet into RecordIO shards, load it fast and correctly, train and benchmark."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="imgpipe: %(levelname)s: %(message)s", stream=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: a user's mistake is one line on stderr and a non-zero exit.

    SIGTERM unwinds like Ctrl-C (``Stopped``), so that a command stopped at any moment cleans up,
    says so in one line and exits 143 (Ctrl-C: 130), which a preemption wrapper reads as a stop.
    """
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        _run(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def _run(argv: list[str] | None) -> None:
    from imgpipe.cli import commands  # noqa: F401  (registers the sub-commands)

    try:
        cli.main(args=argv, prog_name="imgpipe", standalone_mode=False)
    except Stopped as e:
        click.echo(f"imgpipe: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("imgpipe: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except ImgpipeError as e:
        click.echo(f"imgpipe: error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("imgpipe: interrupted", err=True)
        sys.exit(130)
