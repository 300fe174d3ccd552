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
    guard = StopGuard()
    if isinstance(sys.stdout, io.TextIOWrapper):  # a name not UTF-8 (a surrogate escape) is printed escaped, not a traceback
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        code = _run(argv, guard)
    except SystemExit as e:  # a command's own exit code (verify's problems, train's stop)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            click.echo(e.code, err=True)
    except BaseException:  # a bug's traceback: the threads it leaves get the same grace
        guard.finish(1)
        raise
    guard.finish(code)
    sys.exit(code)


def _run(argv: list[str] | None, guard: StopGuard) -> int:
    """Run the command; its exit code, its one line printed where it failed or was stopped.

    The command runs through click's ``make_context`` and ``invoke``, not its ``main``, which prints an
    empty line before it turns Ctrl-C into ``Abort``. The guard hears of the line as it is printed: what
    the exception's frames release next (a loader whose worker is stuck) may block, and then the process
    ends within ``EXIT_GRACE_S``, its line not printed twice.
    """
    try:
        guard.install()  # a stop signal while it imports what it needs is the line below, as one during the imports after it
        from imgpipe.cli import commands  # noqa: F401  (registers the sub-commands)

        with cli.make_context("imgpipe", list(sys.argv[1:] if argv is None else argv)) as ctx:
            cli.invoke(ctx)
    except Stopped as e:
        return _said(guard, f"imgpipe: {e}", e.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        return _said(guard, "imgpipe: aborted", 130)
    except click.exceptions.Exit as e:  # --help
        return e.exit_code
    except click.ClickException as e:
        e.show()
        guard.finish(e.exit_code)
        return e.exit_code
    except ImgpipeError as e:
        return _said(guard, f"imgpipe: error: {e}", e.exit_code)
    except BrokenPipeError:  # output piped into a reader that stopped reading (imgpipe info | head)
        return 1
    return 0


def _said(guard: StopGuard, line: str, code: int) -> int:
    click.echo(line, err=True)
    guard.finish(code)
    return code
