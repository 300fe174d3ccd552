"""One loader's epochs in the process measuring them: images, wall and CPU time, worker and main RSS.

Shared by ``loaders.py``'s children and ``_ffcv_child.py`` (which runs in FFCV's own venv), so it
needs nothing but the standard library and whatever the loader yields (torch tensors).
"""

from __future__ import annotations

import compileall
import os
import resource
import time
from pathlib import Path
from typing import Any, Callable


def compile_bytecode() -> None:
    """Write imgpipe's bytecode before anything is timed, as ``pip install`` does: under
    PYTHONDONTWRITEBYTECODE=1 (set on these machines) an editable install's fresh processes (a pack,
    a loader's store helper) would compile its sources again each time, 0.2-0.4 s of CPU apiece."""
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "imgpipe", quiet=1)


def child_pids() -> list[int]:
    """The live child processes of this one: the DataLoader workers."""
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, private) MB of a process; private = its own pages, not the ones shared with the parent."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0, 0.0
    fields = {line.split(":")[0]: int(line.split()[1]) for line in rollup.splitlines()[1:] if line.endswith("kB")}
    return fields.get("Rss", 0) / 1024, (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / 1024


def cpu_seconds() -> float:
    """CPU time of this process (all threads), its live children and its reaped children."""
    own, gone = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + gone.ru_utime + gone.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in child_pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def one_epoch(loader: Any, dtype: Any) -> int:
    """Images of one pass (every batch checked: the dtype asked, contiguous NCHW, a label per image)."""
    images = 0
    for batch, labels in loader:
        assert batch.dtype == dtype and batch.is_contiguous() and batch.shape[0] == labels.shape[0], (
            batch.dtype,
            batch.shape,
            batch.stride(),
        )
        images += int(labels.numel())
    return images


def run_epochs(build: Callable[[], Any], epochs: int, dtype: Any, counters: Callable[[], dict[str, int]] | None = None) -> dict[str, Any]:
    """Build a loader and run ``epochs`` epochs of it; the first epoch's time includes ``build()``
    (constructing the loader, starting its workers or threads). With ``counters`` (say, a storage
    server's request counts), each epoch also reports how much each counter grew during it."""
    read = counters or dict
    began, cpu_began, counted = time.perf_counter(), cpu_seconds(), read()
    loader = build()
    results = []
    for _ in range(epochs):
        images = one_epoch(loader, dtype)
        now, cpu = time.perf_counter(), cpu_seconds()
        workers = [memory_mb(pid) for pid in child_pids()]
        main_rss, main_private = memory_mb(os.getpid())
        results.append({
            "images": images, "wall_s": now - began, "cpu_s": cpu - cpu_began,
            "worker_rss_mb": max((r for r, _ in workers), default=0.0), "worker_private_mb": max((p for _, p in workers), default=0.0),
            "main_rss_mb": main_rss, "main_private_mb": main_private,
        })  # fmt: skip
        if counters is not None:
            now_counted = read()
            results[-1]["counters"] = {k: now_counted.get(k, 0) - counted.get(k, 0) for k in sorted(set(now_counted) | set(counted))}
            counted = now_counted
        began, cpu_began = time.perf_counter(), cpu_seconds()
    getattr(loader, "close", lambda: None)()
    return {"epochs": results}
