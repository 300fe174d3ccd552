"""The system sampler through psutil: on recorded /proc samples (tests/bench/data), and live on this machine."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from bench_helpers import DATA, recorded

from imgpipe._sys.diskinfo import DiskInfo
from imgpipe.bench.system import SystemSampler, cpu_usage, describe_disk, diskstats_name, read_mb_s, summarize

HDD = DATA / "hdd_iowait"


def cpu(user: float, nice: float, system: float, idle: float, iowait: float) -> SimpleNamespace:
    return SimpleNamespace(user=user, nice=nice, system=system, idle=idle, iowait=iowait, irq=0.0, softirq=0.0, steal=0.0)


def test_iowait_is_computed_as_top_does(monkeypatch: pytest.MonkeyPatch) -> None:
    before, after = recorded(HDD / "before", 100.0, monkeypatch), recorded(HDD / "after", 101.25, monkeypatch)
    assert before.cpu.user == pytest.approx(1052311 / os.sysconf("SC_CLK_TCK"))  # psutil read the recorded cpu line
    util, iowait = cpu_usage(before.cpu, after.cpu)
    assert iowait == pytest.approx(47.4)  # top: "47.4 wa"
    assert util == pytest.approx(24.7)  # 100 - idle 27.9 - wa 47.4


def test_no_time_and_counters_going_backwards_count_as_zero_as_in_top() -> None:
    assert cpu_usage(cpu(1, 0, 0, 1, 0), cpu(1, 0, 0, 1, 0)) == (0.0, 0.0)
    before, after = cpu(100, 0, 0, 800, 100), cpu(150, 0, 0, 850, 90)  # iowait went back by 10 (proc(5): it can)
    assert cpu_usage(before, after) == (50.0, 0.0)  # not a negative iowait over a total of 90


def test_disk_reads_and_memory_of_a_recorded_window(monkeypatch: pytest.MonkeyPatch) -> None:
    before, after = recorded(HDD / "before", 100.0, monkeypatch), recorded(HDD / "after", 101.25, monkeypatch)
    assert before.bytes_read["sdb1"] == 123456000 * 512 and before.bytes_read["nvme0n1p2"] == 98708643 * 512
    assert read_mb_s(before.bytes_read, after.bytes_read, "sdb1", 1.25) == pytest.approx(36.0, abs=0.01)
    assert read_mb_s(before.bytes_read, after.bytes_read, "nvme0n1p2", 1.25) == 0.0
    assert read_mb_s(before.bytes_read, after.bytes_read, "sdz", 1.25) is None
    assert before.mem_available == 38123456 * 1024
    assert before.cached == 36234567 * 1024  # no reclaimable slab recorded: the page cache alone
    summary = summarize([before, after], "sdb1", start=100.0, end=101.25)
    assert summary is not None
    assert summary.iowait_pct == pytest.approx(47.4)
    assert summary.read_mb_s == pytest.approx(36.0, abs=0.01)
    assert summary.mem_available_mb == pytest.approx(38067890 * 1024 / 1e6)
    assert summarize([before], "sdb1") is None


def test_diskstats_name_and_description() -> None:
    hdd = DiskInfo("/dev/sdb1", "/data", "ext4", True, False)
    assert diskstats_name(hdd) == "sdb1"
    assert describe_disk(hdd) == "rotational /dev/sdb1"
    nfs = DiskInfo("server:/export", "/mnt/data", "nfs4", None, True)
    assert diskstats_name(nfs) is None
    assert describe_disk(nfs) == "network nfs4 at /mnt/data"
    assert describe_disk(DiskInfo("overlay", "/", "overlay", None, False)) == "unknown-kind overlay at /"


@pytest.mark.timeout(30)
def test_live_sampler_reads_this_machine() -> None:
    with SystemSampler(interval=0.05) as sampler:
        deadline = time.monotonic() + 10
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(sampler.samples) >= 3
    summary = summarize(sampler.samples, None)
    assert summary is not None and 0.0 <= summary.cpu_util_pct <= 100.0 and 0.0 <= summary.iowait_pct <= 100.0
    assert summary.mem_available_mb > 0 and summary.read_mb_s is None


def test_diskstats_name_of_a_missing_node_comes_from_the_path(tmp_path) -> None:
    st_dev = tmp_path.stat().st_dev
    node = Path(f"/sys/dev/block/{os.major(st_dev)}:{os.minor(st_dev)}")
    if not node.exists():
        pytest.skip(f"{tmp_path} is not on a block device listed in /sys/dev/block")
    root = DiskInfo("/dev/imgpipe-no-such-node", "/", "ext4", None, False)  # like the /dev/root that many mounts name
    name = diskstats_name(root, tmp_path)
    assert name == os.path.basename(os.path.realpath(node))
    assert name in psutil.disk_io_counters(perdisk=True)  # the name psutil counts its reads under
    assert diskstats_name(root) == "imgpipe-no-such-node"  # without a path: the mount's name, as before
