"""``python _read_spy.py pack ...``: imgpipe's CLI, with each source file a pack opens appending a line to the file
``$READ_SPY_LOG``: the opening process's pid and the file's path. Pack workers are forked, so they open through the
same recording functions."""

from __future__ import annotations

import os

from imgpipe.cli import main
from imgpipe.packing import filereads

_open_planned = filereads.open_planned


def logged(path: str) -> None:
    with open(os.environ["READ_SPY_LOG"], "a") as log:  # one short O_APPEND write per line: lines never interleave
        log.write(f"{os.getpid()}\t{path}\n")


def open_planned(path: str, size: int) -> int | str:
    logged(path)
    return _open_planned(path, size)


filereads.open_planned = open_planned  # type: ignore[assignment]
main()
