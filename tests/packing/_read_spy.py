"""``python _read_spy.py pack ...``: imgpipe's CLI, with each source file a pack opens appending a line to the file
``$READ_SPY_LOG``: the opening process's pid and the file's path. Pack workers are forked, so they open through the
same recording functions."""

from __future__ import annotations

import os

from imgpipe.cli import main
from imgpipe.packing import filereads

_open_advised, _read_file = filereads._open_advised, filereads.read_file


def logged(path: str) -> None:
    with open(os.environ["READ_SPY_LOG"], "a") as log:  # one short O_APPEND write per line: lines never interleave
        log.write(f"{os.getpid()}\t{path}\n")


def open_advised(path: str) -> int | str:
    logged(path)
    return _open_advised(path)


def read_file(path: str) -> bytes | str:
    logged(path)
    return _read_file(path)


filereads._open_advised, filereads.read_file = open_advised, read_file  # type: ignore[assignment]
main()
