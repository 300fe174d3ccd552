"""What the machine does during a bench: CPU and iowait, disk reads, memory and page cache, through psutil.

CPU from ``psutil.cpu_times()`` as ``top`` computes its ``%Cpu(s)`` line (``wa = Δiowait / Δtotal``;
guest time is inside user and nice, so not added twice; each Δ clamped at 0), the bytes read by the
device that holds DATA (:func:`imgpipe._sys.diskinfo.device_for_path`), memory available and cached as
``free`` counts them. ``SystemSampler`` reads them in a background thread (4 Hz by default).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from imgpipe._sys.diskinfo import DiskInfo

logger = logging.getLogger(__name__)

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")  # top's total; guest is inside user


def cpu_usage(before: Any, after: Any) -> tuple[float, float]:
    """(utilisation %, iowait %) between two ``psutil.cpu_times()``, as top's %Cpu(s) line reports them.

    Like top, a counter that went backwards (iowait can, see proc(5)) counts as 0, not negative.
    """
    deltas = {name: max(0.0, getattr(after, name, 0.0) - getattr(before, name, 0.0)) for name in CPU_FIELDS}
    total = sum(deltas.values())
    if total <= 0:
        return 0.0, 0.0
    return 100.0 * (total - deltas["idle"] - deltas["iowait"]) / total, 100.0 * deltas["iowait"] / total


def read_mb_s(before: dict[str, int], after: dict[str, int], device: str, seconds: float) -> float | None:
    """Read throughput of ``device`` in MB/s (10**6 bytes) between two samples of bytes read per device."""
    if device not in before or device not in after or seconds <= 0:
        return None
    return (after[device] - before[device]) / seconds / 1e6


# ----------------------------------------------------------------------------- which disk


def diskstats_name(info: DiskInfo, path: str | os.PathLike | None = None) -> str | None:
    """The name of the device holding a path in psutil's per-disk counters (/proc/diskstats): ``/dev/sdb1`` -> ``sdb1``; or None.

    A partition has its own counters, so its reads are the reads of DATA's filesystem. When the
    mount names a node that does not exist (``/dev/root``), ``path``'s ``st_dev`` is looked up in
    ``/sys/dev/block`` instead.
    """
    if not info.device.startswith("/dev/"):
        return None
    real = os.path.realpath(info.device)
    if path is None or os.path.exists(real):
        return os.path.basename(real)
    try:
        st_dev = os.stat(path).st_dev
    except OSError:
        return None
    node = Path(f"/sys/dev/block/{os.major(st_dev)}:{os.minor(st_dev)}")
    return os.path.basename(os.path.realpath(node)) if node.exists() else None


def describe_disk(info: DiskInfo) -> str:
    """``rotational /dev/sdb``, ``network nfs4 at /mnt/data``, ``non-rotational /dev/nvme0n1p2``."""
    if info.network:
        return f"network {info.fstype} at {info.mountpoint}"
    kind = {True: "rotational", False: "non-rotational", None: "unknown-kind"}[info.rotational]
    where = info.device if info.device.startswith("/dev/") else f"{info.fstype or 'unknown'} at {info.mountpoint}"
    return f"{kind} {where}"


# ----------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Sample:
    """One reading of the system counters at wall time ``t`` (time.time())."""

    t: float
    cpu: Any  # psutil.cpu_times()
    bytes_read: dict[str, int]  # per device, as diskstats names them
    mem_available: int
    cached: int


def take_sample(t: float | None = None) -> Sample:
    """Read the CPU times, the bytes read per device and the memory, stamped ``t``."""
    disks = psutil.disk_io_counters(perdisk=True, nowrap=False) or {}
    memory = psutil.virtual_memory()
    return Sample(
        t=time.time() if t is None else t,
        cpu=psutil.cpu_times(),
        bytes_read={name: counters.read_bytes for name, counters in disks.items()},
        mem_available=memory.available,
        cached=getattr(memory, "cached", 0),
    )


@dataclass(frozen=True)
class SystemSummary:
    """The system over one time window; None where it could not be measured."""

    seconds: float
    samples: int
    cpu_util_pct: float
    iowait_pct: float
    iowait_max_pct: float
    read_mb_s: float | None
    mem_available_mb: float
    cached_mb: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(samples: list[Sample], device: str | None, start: float | None = None, end: float | None = None) -> SystemSummary | None:
    """Summarise the samples inside [start, end] (plus the nearest one on each side)."""
    if start is not None:
        before = [s for s in samples if s.t <= start]
        inside = [s for s in samples if start < s.t < (end if end is not None else float("inf"))]
        after = [s for s in samples if end is not None and s.t >= end]
        window = before[-1:] + inside + after[:1]
    else:
        window = list(samples)
    if len(window) < 2:
        return None
    first, last = window[0], window[-1]
    util, iowait = cpu_usage(first.cpu, last.cpu)
    peak = max((cpu_usage(a.cpu, b.cpu)[1] for a, b in zip(window, window[1:])), default=iowait)
    seconds = last.t - first.t
    return SystemSummary(
        seconds=seconds,
        samples=len(window),
        cpu_util_pct=util,
        iowait_pct=iowait,
        iowait_max_pct=peak,
        read_mb_s=read_mb_s(first.bytes_read, last.bytes_read, device, seconds) if device else None,
        mem_available_mb=min(s.mem_available for s in window) / 1e6,
        cached_mb=last.cached / 1e6,
    )


class SystemSampler:
    """Sample the system in a daemon thread every ``interval`` seconds until stopped."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="imgpipe-bench-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(take_sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> "SystemSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(take_sample())
