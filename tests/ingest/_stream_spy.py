"""``python _stream_spy.py pack ...``: imgpipe's CLI, with each read of a ``.tar.gz`` unit appending a JSON line to the
file ``$STREAM_SPY_LOG``: the unit, the ordinals it was asked for, and how far into the decompressed tar it read.
Pack workers are forked, so they read through the same recording functions."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from imgpipe.cli import main
from imgpipe.ingest import streams

_open_tar_gz, _tar_gz_members = streams.open_tar_gz, streams._tar_gz_members
_opened: list[Any] = []


def open_tar_gz(path: Path) -> Any:
    opened = _open_tar_gz(path)
    _opened.append(opened)
    return opened


def tar_gz_members(path: Path, wanted: np.ndarray, sizes: np.ndarray) -> Iterator[tuple[int, bytes]]:
    yield from _tar_gz_members(path, wanted, sizes)
    with open(os.environ["STREAM_SPY_LOG"], "a") as log:
        log.write(json.dumps({"unit": str(path), "wanted": wanted.tolist(), "position": _opened[-1].position}) + "\n")


streams.open_tar_gz, streams._tar_gz_members = open_tar_gz, tar_gz_members  # type: ignore[assignment]
main()
