"""The ``imgpipe`` command: a thin click layer; each sub-module registers one command family."""

from __future__ import annotations

import io
import logging
import sys

import click

from imgpipe.cli.stopping import StopGuard
from imgpipe.errors import ImgpipeError, Stopped


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
def cli(verbose: bool) -> None:
    """imgpipe: pack ImageNet into RecordIO shards, load it fast and correctly, train and benchmark."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="imgpipe: %(levelname)s: %(message)s", stream=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Console entry point; it ends the process. A user's mistake is one line on stderr and a non-zero exit.

    SIGTERM unwinds like Ctrl-C (``Stopped``), so that a command stopped at any moment cleans up,
    says so in one line and exits 143 (Ctrl-C: 130), which a preemption wrapper reads as a stop;
    the process ends within a few seconds of either, whatever its threads do (``stopping``).
    """
    guard = StopGuard().install()
    if isinstance(sys.stdout, io.TextIOWrapper):  # a name not UTF-8 (a surrogate escape) is printed escaped, not a traceback
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        code = _run(argv)
    except SystemExit as e:  # a command's own exit code (verify's problems, train's stop)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            click.echo(e.code, err=True)
    except BaseException:  # a bug's traceback: the threads it leaves get the same grace
        guard.finish(1)
        raise
    guard.finish(code)
    sys.exit(code)


def _run(argv: list[str] | None) -> int:
    """Run the command; its exit code, its one line printed where it failed or was stopped.

    The command runs through click's ``make_context`` and ``invoke``, not its ``main``, which prints an
    empty line before it turns Ctrl-C into ``Abort``.
    """
    try:
        from imgpipe.cli import commands  # noqa: F401  (registers the sub-commands)

        with cli.make_context("imgpipe", list(sys.argv[1:] if argv is None else argv)) as ctx:
            cli.invoke(ctx)
    except Stopped as e:
        click.echo(f"imgpipe: {e}", err=True)
        return e.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        click.echo("imgpipe: aborted", err=True)
        return 130
    except click.exceptions.Exit as e:  # --help
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except ImgpipeError as e:
        click.echo(f"imgpipe: error: {e}", err=True)
        return e.exit_code
    except BrokenPipeError:  # output piped into a reader that stopped reading (imgpipe info | head)
        return 1
    return 0
