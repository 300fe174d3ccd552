"""``imgpipe pack``, ``imgpipe verify`` and ``imgpipe info``: parse options, call the library, print."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Mapping

import click

from imgpipe.cli import cli
from imgpipe.errors import PackError, Stopped

if TYPE_CHECKING:
    from imgpipe.packing.parts import ArrayTask

logger = logging.getLogger(__name__)


@cli.command("pack")
@click.argument("src", nargs=-1, required=True)
@click.argument("dst")
@click.option("--splits", default=None, help="Comma-separated splits to pack (default: every split found), e.g. train,val.")
@click.option(
    "--shard-size",
    default=None,
    help="Target shard size, e.g. 256MB (default), 2MB, 1GiB; measured on the source files, so --resize gives smaller shards.",
)
@click.option("--shards", default=None, help="Shard count instead of --shard-size: N per split, or train=1024,val=64.")
@click.option("--workers", type=int, default=None, help="Worker processes (default: all CPUs). Output does not depend on it.")
@click.option("--resize", type=int, default=None, help="Resize so the shorter side is S pixels (never upscales).")
@click.option("--quality", type=int, default=95, show_default=True, help="JPEG quality of re-encoded images.")
@click.option("--shuffle/--no-shuffle", default=True, show_default=True, help="Shuffle items (by --seed) before sharding.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the shuffle.")
@click.option("--overwrite", is_flag=True, help="Delete a previous pack in DST and start again.")
@click.option("--strict", is_flag=True, help="Exit non-zero if any source file was skipped.")
@click.option(
    "--num-nodes",
    type=int,
    default=None,
    help="Machines sharing the pack (default: SLURM_ARRAY_TASK_COUNT in an array job, SLURM_NNODES under srun, else 1).",
)
@click.option(
    "--node-rank",
    type=int,
    default=None,
    help="This machine's part in 0..num-nodes-1 (default: from SLURM_ARRAY_TASK_ID in an array job, SLURM_NODEID under srun, else 0).",
)
@click.option("--finalize", is_flag=True, help="Only write the manifest once every part is written; else name the parts missing.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@click.option(
    "--checkpoint-every",
    "checkpoint_s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds between checkpoints of the records written: a killed pack loses at most this much work (0: at every result).",
)
def pack_command(
    src: tuple[str, ...], dst: str, splits: str | None, num_nodes: int | None, node_rank: int | None, no_progress: bool, **options: object
) -> None:
    """Pack SRC into RecordIO shards in DST.

    SRC is an ImageNet-style folder (train/ and val/, the Kaggle download, class folders, or
    image-net.org's tars), one tar, or image-net.org's files named one by one:
    ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar, and ILSVRC2012_devkit_t12.tar.gz or
    LOC_val_solution.csv.
    """
    from imgpipe.packing.packer import pack

    split_list = [s.strip() for s in splits.split(",") if s.strip()] if splits is not None else None
    if split_list == []:
        raise PackError(f"--splits {splits!r} names no split; give e.g. --splits train,val or leave it out for every split")
    nodes, rank, array_task = node_identity(num_nodes, node_rank, os.environ)
    try:
        report = pack(
            src[0] if len(src) == 1 else src,
            dst,
            splits=split_list,
            num_nodes=nodes,
            node_rank=rank,
            array_task=array_task,
            progress=not no_progress and sys.stderr.isatty(),
            **options,  # type: ignore[arg-type]
        )
    except (KeyboardInterrupt, Stopped) as e:
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        raise Stopped(signum, f"rerun the same command to resume; the records written in {dst} are kept") from None
    click.echo(report.summary())


def node_identity(num_nodes: int | None, node_rank: int | None, environ: Mapping[str, str]) -> tuple[int, int, ArrayTask | None]:
    """(--num-nodes, --node-rank, the SLURM array task that picks the part instead).

    The options win when given (both of them, in an array job); else an array task picks the part
    (with srun's SLURM_NNODES/SLURM_NODEID within it); else srun's node; else one node.
    """
    from imgpipe.packing.parts import ArrayTask

    array_task = ArrayTask.from_environ(environ)
    if array_task is not None and (num_nodes is None) != (node_rank is None):
        raise PackError(
            "--num-nodes and --node-rank in a SLURM array job: give both, or neither to take the part from the array "
            f"({array_task.describe()})"
        )
    if array_task is not None and num_nodes is None:
        return 1, 0, array_task
    taken = []
    if num_nodes is None and environ.get("SLURM_NNODES"):
        num_nodes = _slurm_int(environ, "SLURM_NNODES", "--num-nodes")
        taken.append("SLURM_NNODES")
    if node_rank is None and environ.get("SLURM_NODEID"):
        node_rank = _slurm_int(environ, "SLURM_NODEID", "--node-rank")
        taken.append("SLURM_NODEID")
    nodes, rank = (1 if num_nodes is None else num_nodes), (0 if node_rank is None else node_rank)
    if taken:
        logger.info("node %d of %d, from %s (--num-nodes/--node-rank override it)", rank, nodes, " and ".join(taken))
    return nodes, rank, None


def _slurm_int(environ: Mapping[str, str], name: str, option: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise PackError(f"{name}={environ[name]!r} is not an integer; give {option}") from None


@cli.command("verify")
@click.argument("dst", type=click.Path(path_type=str))
@click.option("--decode", is_flag=True, help="Also decode every image.")
@click.option("--workers", type=int, default=None, help="Worker processes (default: all CPUs).")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@click.option("--max-problems", type=click.IntRange(min=0), default=50, show_default=True, help="Print at most this many problems.")
def verify_command(dst: str, decode: bool, workers: int | None, no_progress: bool, max_problems: int) -> None:
    """Check a packed folder (or bare .rec/.idx pairs) for completeness and integrity."""
    from imgpipe.format.info import resize_line
    from imgpipe.format.verify import verify
    from imgpipe.image.shrink import resizer

    report = verify(dst, decode=decode, workers=workers, progress=not no_progress and sys.stderr.isatty())
    for problem in report.problems[:max_problems]:
        click.echo(str(problem))
    if len(report.problems) > max_problems:
        click.echo(f"... and {len(report.problems) - max_problems} more problem(s)")
    if report.options is not None and (resized := resize_line(report.options, resizer())) is not None:
        click.echo(resized)
    click.echo(report.summary())
    if not report.ok:
        sys.exit(1)


@cli.command("info")
@click.argument("dst", type=click.Path(path_type=str))
@click.option(
    "--skipped", "show_skipped", type=click.IntRange(min=0), default=20, show_default=True, help="List at most this many skipped files."
)
def info_command(dst: str, show_skipped: int) -> None:
    """Print what a packed dataset holds: splits, records, bytes, classes, options, skipped files."""
    from imgpipe.format.info import describe, format_info
    from imgpipe.image.shrink import resizer

    click.echo(format_info(describe(dst), show_skipped=show_skipped, resizer_here=resizer()))
