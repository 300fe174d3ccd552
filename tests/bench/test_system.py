"""/proc parsing on recorded samples (tests/bench/data), and the live sampler on this machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from bench_helpers import DATA

from imgpipe._sys.diskinfo import DiskInfo
from imgpipe.bench.system import (
    SystemSampler,
    cpu_usage,
    describe_disk,
    diskstats_name,
    parse_diskstats,
    parse_meminfo,
    parse_proc_stat,
    read_mb_s,
    summarize,
    take_sample,
)

HDD = DATA / "hdd_iowait"


def test_proc_stat_aggregate_line_is_parsed() -> None:
    cpu = parse_proc_stat((HDD / "before" / "stat").read_text())
    assert (cpu.user, cpu.nice, cpu.system, cpu.idle, cpu.iowait, cpu.softirq) == (1052311, 2104, 301877, 5123456, 400120, 10021)
    assert cpu.total == 1052311 + 2104 + 301877 + 5123456 + 400120 + 10021


def test_iowait_is_computed_as_top_does() -> None:
    before = parse_proc_stat((HDD / "before" / "stat").read_text())
    after = parse_proc_stat((HDD / "after" / "stat").read_text())
    util, iowait = cpu_usage(before, after)
    assert iowait == pytest.approx(47.4)  # top: "47.4 wa"
    assert util == pytest.approx(24.7)  # 100 - idle 27.9 - wa 47.4


def test_proc_stat_old_kernel_and_garbage() -> None:
    assert parse_proc_stat("cpu  10 0 5 100\n").total == 115  # no iowait/irq/steal columns
    with pytest.raises(ValueError):
        parse_proc_stat("intr 1 2 3\n")
    assert cpu_usage(parse_proc_stat("cpu 1 0 0 1"), parse_proc_stat("cpu 1 0 0 1")) == (0.0, 0.0)


def test_counter_going_backwards_counts_as_zero_as_in_top() -> None:
    before = parse_proc_stat("cpu 100 0 0 800 100 0 0 0\n")
    after = parse_proc_stat("cpu 150 0 0 850 90 0 0 0\n")  # iowait went back by 10 (proc(5): it can)
    assert cpu_usage(before, after) == (50.0, 0.0)  # not a negative iowait over a total of 90


def test_diskstats_sectors_and_throughput() -> None:
    before = parse_diskstats((HDD / "before" / "diskstats").read_text())
    after = parse_diskstats((HDD / "after" / "diskstats").read_text())
    assert before["sdb1"] == 123456000 and before["nvme0n1p2"] == 98708643
    assert read_mb_s(before, after, "sdb1", 1.25) == pytest.approx(36.0, abs=0.01)
    assert read_mb_s(before, after, "nvme0n1p2", 1.25) == 0.0
    assert read_mb_s(before, after, "sdz", 1.25) is None


def test_meminfo_in_bytes() -> None:
    mem = parse_meminfo((HDD / "before" / "meminfo").read_text())
    assert mem["MemAvailable"] == 38123456 * 1024
    assert mem["Cached"] == 36234567 * 1024


def test_summary_of_recorded_window() -> None:
    samples = [take_sample(HDD / "before", t=100.0), take_sample(HDD / "after", t=101.25)]
    summary = summarize(samples, "sdb1", start=100.0, end=101.25)
    assert summary is not None
    assert summary.iowait_pct == pytest.approx(47.4)
    assert summary.read_mb_s == pytest.approx(36.0, abs=0.01)
    assert summary.mem_available_mb == pytest.approx(38067890 * 1024 / 1e6)
    assert summarize(samples[:1], "sdb1") is None


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
        time.sleep(0.3)
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
    assert name in parse_diskstats(Path("/proc/diskstats").read_text())
    assert diskstats_name(root) == "imgpipe-no-such-node"  # without a path: the mount's name, as before
