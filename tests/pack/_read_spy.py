"""``python _read_spy.py pack ...``: imgpipe's CLI, with each source file a pack reads appending a line to the file
``$READ_SPY_LOG``: the reading process's pid and the file's path. Pack workers are forked, so they read through the
same recording function."""

from __future__ import annotations

import os

from imgpipe.cli import main
from imgpipe.pack import readorder

_read_file = readorder.read_file


def read_file(path: str) -> bytes | str:
    with open(os.environ["READ_SPY_LOG"], "a") as log:  # one short O_APPEND write per line: lines never interleave
        log.write(f"{os.getpid()}\t{path}\n")
    return _read_file(path)


readorder.read_file = read_file  # type: ignore[assignment]
main()
