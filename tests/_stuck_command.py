"""``python _stuck_command.py KIND MARKER pack SRC DST ...``: imgpipe's CLI, where listing a Hugging Face Parquet
file never ends, and something keeps the process from ending: touches MARKER once it is stuck.

KIND: ``spinning`` (a non-daemon thread spins in Python, as a parser looping forever does), ``blocked`` (a
non-daemon thread waits forever), ``main-in-c`` (the main thread locks a mutex it holds: stuck in C,
without the GIL, where no Python signal handler runs), ``workers`` (as ``main-in-c``, with two worker
processes of its own waiting forever).
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from imgpipe.cli import main
from imgpipe.ingest import huggingface

kind, marker = sys.argv.pop(1), Path(sys.argv.pop(1))


def spin() -> None:
    while True:
        pass


def stuck_in_c() -> None:
    libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)  # a pthread_mutex_t fits in 64 bytes
    libc.pthread_mutex_init(mutex, None)
    libc.pthread_mutex_lock(mutex)
    marker.touch()
    libc.pthread_mutex_lock(mutex)


def never_lists(*_: object) -> None:
    if kind == "workers":
        pool = ProcessPoolExecutor(2)
        for _ in range(2):
            pool.submit(signal.pause)  # busy until a signal ends it
        deadline = time.monotonic() + 60
        while len(pool._processes) < 2 and time.monotonic() < deadline:  # started: the test reads them from /proc
            time.sleep(0.01)
    if kind in ("main-in-c", "workers"):
        stuck_in_c()
    threading.Thread(target=spin if kind == "spinning" else threading.Event().wait, daemon=False).start()
    marker.touch()
    spin()


if kind in ("main-in-c", "workers"):
    huggingface._list_split = never_lists  # in the main thread
else:
    huggingface._list_parquet = never_lists  # in a listing thread
main()
