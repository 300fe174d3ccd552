"""``imgpipe pack`` against the storage it reads, as root (loop devices, drop_caches, cgroup v1 blkio, FUSE):

- ``travel``: the head travel of pack's read order on ext4 (a loop-mounted image): the order each
  process opens the tree's files (``strace -f -e trace=openat``) against each file's physical offset
  (FIEMAP, FIEMAP_FLAG_SYNC), as multiples of one sweep over the tree; with name, inode and physical
  order for reference.
- ``cold``: files/s from this machine's own disk, caches dropped before each run, runs alternated,
  medians: pack against ``tar cf - SRC | cat > /dev/null`` of the same tree of tiny JPEGs (only the
  count is large), with pack's peak RSS.
- ``throttled``: the same on a loop device (direct I/O) under blkio ``read_iops_device`` and
  ``read_bps_device`` throttles.
- ``latency``: through a FUSE passthrough that waits ``--delay-ms`` on every open (a round trip per
  file, as on NFS): pack against a 16-thread parallel read. Needs ``--fuse-python``, a venv with fusepy.

Each takes ``--baseline DIR``: another imgpipe checkout (e.g. ``git worktree add /tmp/main main``)
measured the same way, alternated, as the "before". Prints ratios; figures in docs/benchmarks.md.

    sudo python benchmarks/pack_storage.py travel --baseline /tmp/main
    sudo python benchmarks/pack_storage.py cold --classes 100 --per-class 1281 --val 5000 --rounds 3
"""

from __future__ import annotations

import argparse
import array
import compileall
import contextlib
import fcntl
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from _measure import compile_bytecode  # noqa: E402
from _tinytree import count_files, make_tiny_tree  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FS_IOC_FIEMAP, FIEMAP_FLAG_SYNC = 0xC020660B, 1
FIEMAP_HEAD, FIEMAP_EXTENT = struct.Struct("=QQLLLL"), struct.Struct("=QQQQQLLLL")
OPENAT = re.compile(r'^(\d+)\s+openat\(AT_FDCWD, "((?:[^"\\]|\\.)*)", ([A-Z_|]+)')
CLONE = re.compile(r"^(\d+)\s+(clone3?|fork|vfork)\((.*)")
RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (clone3?|fork|vfork) resumed>.*= (\d+)")
RETURNS = re.compile(r"= (\d+)$")


# ----------------------------------------------------------------------------- helpers


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def ext4_image(image: Path, size: str, direct_io: bool = False) -> Iterator[tuple[Path, str]]:
    """A fresh ext4 file system in ``image``, on a loop device; yields (mount point, device)."""
    image.parent.mkdir(parents=True, exist_ok=True)
    image.unlink(missing_ok=True)
    sh("truncate", "-s", size, str(image))
    device = sh("losetup", "-f", "--show", *(["--direct-io=on"] if direct_io else []), str(image))
    mount = image.with_suffix(".mnt")
    try:
        sh("mkfs.ext4", "-q", "-F", device)
        mount.mkdir(exist_ok=True)
        sh("mount", device, str(mount))
        try:
            yield mount, device
        finally:
            sh("umount", str(mount))
    finally:
        sh("losetup", "-d", device)
        image.unlink(missing_ok=True)


def imgpipe_env(checkout: Path) -> dict[str, str]:
    """The environment that runs ``checkout``'s imgpipe (the commands run outside any checkout: ``-m`` looks in the cwd first)."""
    return {**os.environ, "PYTHONPATH": str(checkout)}


def pack_command(src: Path, dst: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), "--workers", str(workers), "--no-progress"]


def contenders(args: argparse.Namespace) -> dict[str, Path]:
    """The imgpipe checkouts to measure: this one, and the baseline if given."""
    found = {"pack": REPO}
    if args.baseline:
        found["pack (baseline)"] = Path(args.baseline).resolve()
    return found


class PeakMemory:
    """Samples a process tree's memory: peak RSS of the root and of any child, peak sum of PSS."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.parent = self.child = self.pss = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            pss = 0
            for proc in tree:
                try:
                    memory = proc.memory_full_info()
                except psutil.Error:
                    continue
                pss += memory.pss
                if proc.pid == self.root.pid:
                    self.parent = max(self.parent, memory.rss)
                else:
                    self.child = max(self.child, memory.rss)
            self.pss = max(self.pss, pss)

    def close(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        return {"parent_rss_mb": self.parent / 2**20, "worker_rss_mb": self.child / 2**20, "pss_mb": self.pss / 2**20}


def timed(command: list[str] | str, env: dict[str, str] | None = None, cgroup: Path | None = None, memory: bool = False) -> dict:
    """Run ``command`` (a shell line when a str); wall and CPU seconds (its process tree), peak memory if asked."""
    before = os.times()
    start = time.perf_counter()
    shell = isinstance(command, str)
    preexec = (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup else None
    process = subprocess.Popen(
        command, shell=shell, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=preexec, cwd="/"
    )
    peak = PeakMemory(process.pid) if memory else None
    _, err = process.communicate()
    wall = time.perf_counter() - start
    after = os.times()
    result = {"wall": wall, "cpu": (after.children_user - before.children_user) + (after.children_system - before.children_system)}
    if peak is not None:
        result.update(peak.close())
    if process.returncode:
        raise SystemExit(f"{command} failed ({process.returncode}): {err.decode()[-2000:]}")
    return result


def alternate(runs: dict[str, callable], rounds: int) -> dict[str, list[dict]]:  # type: ignore[valid-type]
    """Each run once per round, the order rotated each round, caches dropped before each."""
    results: dict[str, list[dict]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            drop_caches()
            results[name].append(runs[name]())
            shown = {k: round(v, 1) for k, v in results[name][-1].items()}
            print(f"  round {r + 1}: {name}: {shown}", flush=True)
    return results


def report(results: dict[str, list[dict]], files: int, reference: str, machine: str) -> None:
    print(f"\n{files:,} files; median of {len(next(iter(results.values())))} rounds; {machine}")
    base = files / statistics.median(run["wall"] for run in results[reference])
    print(f"  {'reader':24s} {'files/s':>9s} {'x ' + reference:>9s} {'CPU s':>7s}  memory (peak)")
    for name, runs in results.items():
        rate = files / statistics.median(run["wall"] for run in runs)
        cpu = statistics.median(run["cpu"] for run in runs)
        mem = ""
        if "parent_rss_mb" in runs[0]:
            mem = (f"parent RSS {max(r['parent_rss_mb'] for r in runs):,.0f} MB, a worker {max(r['worker_rss_mb'] for r in runs):,.0f} MB,"
                   f" PSS of all {max(r['pss_mb'] for r in runs):,.0f} MB")  # fmt: skip
        print(f"  {name:24s} {rate:9,.0f} {rate / base:9.2f} {cpu:7.1f}  {mem}")


def machine_note() -> str:
    load = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (a shared machine: other sessions run too)"


# ----------------------------------------------------------------------------- travel


def physical_offset(path: Path) -> int | None:
    """The physical byte offset of the file's first extent (FIEMAP, synced first); None for an empty file."""
    request = bytearray(FIEMAP_HEAD.size + FIEMAP_EXTENT.size)
    FIEMAP_HEAD.pack_into(request, 0, 0, 2**64 - 1, FIEMAP_FLAG_SYNC, 0, 1, 0)
    buffer = array.array("B", request)
    with open(path, "rb") as f:
        fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buffer, True)
    if FIEMAP_HEAD.unpack_from(buffer, 0)[3] == 0:
        return None
    return FIEMAP_EXTENT.unpack_from(buffer, FIEMAP_HEAD.size)[1]


def travel(offsets: list[int]) -> int:
    return sum(abs(b - a) for a, b in zip(offsets, offsets[1:]))


def opens_per_process(log: Path, wanted: dict[str, int]) -> tuple[dict[int, list[int]], list[int]]:
    """From ``strace -f`` output: the physical offsets of the wanted files each process opened to read, in order, and of all
    such opens. Opens with O_NONBLOCK are left out: pack's plan opens each file so, to ask FIEMAP where it is, and reads nothing."""
    process_of: dict[int, int] = {}
    pending: dict[int, str] = {}
    per: dict[int, list[int]] = {}
    every: list[int] = []
    for line in log.read_text(errors="replace").splitlines():
        tid = int(line.split(None, 1)[0]) if line[:1].isdigit() else None
        if tid is None:
            continue
        process_of.setdefault(tid, tid)
        clone, resumed = CLONE.match(line), RESUMED.match(line)
        if clone and "<unfinished" in line:
            pending[tid] = clone.group(3)
        elif clone or resumed:
            flags = clone.group(3) if clone else pending.pop(tid, "")
            child = RETURNS.search(line)
            if child:
                process_of[int(child.group(1))] = process_of[tid] if "CLONE_THREAD" in flags else int(child.group(1))
        opened = OPENAT.match(line)
        if opened and opened.group(2) in wanted and "O_NONBLOCK" not in opened.group(3):  # the plan's opens read no data
            offset = wanted[opened.group(2)]
            per.setdefault(process_of[tid], []).append(offset)
            every.append(offset)
    return per, every


def run_travel(args: argparse.Namespace) -> None:
    work = Path(args.root)
    with ext4_image(work / "travel.img", "2G") as (mount, _):
        src = mount / "src"
        synth = [sys.executable, "-m", "imgpipe", "synth", str(src), "--classes", str(args.classes), "--per-class", str(args.per_class),
                 "--val-per-class", str(args.val_per_class), "--min-side", "24", "--max-side", "40", "--workers", "2"]  # fmt: skip
        subprocess.run(synth, check=True, env=imgpipe_env(REPO), capture_output=True, cwd="/")
        files = sorted(p for p in src.rglob("*.JPEG") if p.is_file())
        located = {str(p): physical_offset(p) for p in files}
        wanted = {path: offset for path, offset in located.items() if offset is not None}
        sweep = max(wanted.values()) - min(wanted.values())
        print(f"{len(wanted):,} files on ext4 ({mount}), one sweep = {sweep / 2**20:,.1f} MiB; {machine_note()}")
        inodes = {path: os.stat(path).st_ino for path in wanted}
        print(f"  {'reader':30s} {'per process (max)':>18s} {'all processes':>14s} {'in time order':>14s}")
        for name, order in (("sorted names", sorted(wanted)), ("inode order", sorted(wanted, key=inodes.get)),
                            ("physical order", sorted(wanted, key=wanted.get))):  # fmt: skip
            ratio = travel([wanted[p] for p in order]) / sweep
            print(f"  {name:30s} {ratio:18.1f} {ratio:14.1f} {ratio:14.1f}")
        for name, checkout in contenders(args).items():
            ratios = []
            for _ in range(args.rounds):
                dst, log = work / "travel-out", work / "travel.strace"
                shutil.rmtree(dst, ignore_errors=True)
                drop_caches()
                command = ["strace", "-f", "-qq", "-s", "4096", "-e", "trace=openat,clone,clone3,fork,vfork", "-o", str(log),
                           *pack_command(src, dst, args.workers)]  # fmt: skip
                subprocess.run(command, check=True, env=imgpipe_env(checkout), capture_output=True, cwd="/")
                per, every = opens_per_process(log, wanted)
                assert sum(map(len, per.values())) == len(wanted), f"{name}: {sum(map(len, per.values()))} opens of {len(wanted)} files"
                ratios.append((max(travel(o) for o in per.values()) / sweep, sum(travel(o) for o in per.values()) / sweep,
                               travel(every) / sweep, len(per)))  # fmt: skip
                shutil.rmtree(dst)
                log.unlink()
            worst, total, timed_order, processes = (statistics.median(r[i] for r in ratios) for i in range(4))
            label = f"{name}, {int(processes)} reading process(es)"
            print(f"  {label:30s} {worst:18.1f} {total:14.1f} {timed_order:14.1f}")


# ----------------------------------------------------------------------------- cold, throttled


def tar_command(src: Path) -> str:
    return f"tar cf - -C {src.parent} {src.name} | cat > /dev/null"


def pack_runs(args: argparse.Namespace, src: Path, out: Path, cgroup: Path | None = None) -> dict:
    runs = {"tar": lambda: timed(tar_command(src), cgroup=cgroup)}
    for name, checkout in contenders(args).items():

        def run(checkout: Path = checkout) -> dict:
            shutil.rmtree(out, ignore_errors=True)
            result = timed(pack_command(src, out, args.workers), env=imgpipe_env(checkout), cgroup=cgroup, memory=True)
            shutil.rmtree(out)
            return result

        runs[name] = run
    return runs


def run_cold(args: argparse.Namespace) -> None:
    work = Path(args.root)
    src = make_tiny_tree(work / f"tiny-{args.classes}x{args.per_class}+{args.val}", args.classes, args.per_class, args.val)
    files = count_files(src)
    print(f"{src}: {files:,} tiny JPEGs on {sh('findmnt', '-n', '-o', 'SOURCE,FSTYPE', '-T', str(src))}; --workers {args.workers}")
    results = alternate(pack_runs(args, src, work / "cold-out"), args.rounds)
    report(results, files, "tar", machine_note())


def run_throttled(args: argparse.Namespace) -> None:
    work = Path(args.root)
    cgroup = Path("/sys/fs/cgroup/blkio") / "imgpipe-bench"
    with ext4_image(work / "throttled.img", "4G", direct_io=True) as (mount, device):
        src = make_tiny_tree(mount / "src", args.classes, args.per_class, args.val)
        files = count_files(src)
        major_minor = sh("lsblk", "-dno", "MAJ:MIN", device).strip()
        cgroup.mkdir(exist_ok=True)
        try:
            (cgroup / "blkio.throttle.read_iops_device").write_text(f"{major_minor} {args.iops}\n")
            (cgroup / "blkio.throttle.read_bps_device").write_text(f"{major_minor} {args.bps}\n")
            print(
                f"{files:,} tiny JPEGs on {device} (ext4, direct I/O), reads throttled to {args.iops:,} IOPS and {args.bps / 1e6:.0f} MB/s"
            )
            results = alternate(pack_runs(args, src, work / "throttled-out", cgroup), args.rounds)
        finally:
            for process in (cgroup / "cgroup.procs").read_text().split():
                Path("/sys/fs/cgroup/blkio/cgroup.procs").write_text(process)
            cgroup.rmdir()
    report(results, files, "tar", machine_note())


# ----------------------------------------------------------------------------- latency


def parallel_read(src: Path, threads: int) -> None:
    """Read every file under ``src`` with ``threads`` threads (the reference for latency-bound storage)."""
    paths = [os.path.join(folder, name) for folder, _, names in os.walk(src) for name in names]

    def read(path: str) -> int:
        with open(path, "rb") as f:
            return len(f.read())

    with ThreadPoolExecutor(threads) as pool:
        sum(pool.map(read, paths, chunksize=16))


@contextlib.contextmanager
def delayed_mount(src: Path, mount: Path, delay_ms: float, python: str) -> Iterator[Path]:
    mount.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen([python, str(Path(__file__).parent / "_delayfs.py"), str(src), str(mount), str(delay_ms)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the FUSE server did not mount {mount} (needs libfuse2 and fusepy in {python})")
            time.sleep(0.1)
        yield mount
    finally:
        subprocess.run(["fusermount", "-u", str(mount)], check=False)
        server.wait(timeout=30)


def run_latency(args: argparse.Namespace) -> None:
    if not args.fuse_python:
        raise SystemExit("latency needs --fuse-python: a venv's python with fusepy (python -m venv V && V/bin/pip install fusepy)")
    work = Path(args.root)
    src = make_tiny_tree(work / f"tiny-{args.classes}x{args.per_class}+{args.val}", args.classes, args.per_class, args.val)
    files = count_files(src)
    with delayed_mount(src, work / "delayed.mnt", args.delay_ms, args.fuse_python) as mount:
        print(f"{files:,} tiny JPEGs through a FUSE passthrough that waits {args.delay_ms} ms per open; --workers {args.workers}")
        code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from pack_storage import parallel_read; "
        runs = {
            "16-thread read": lambda: timed([sys.executable, "-c", code + f"parallel_read(__import__('pathlib').Path({str(mount)!r}), 16)"])
        }
        for name, checkout in contenders(args).items():

            def run(checkout: Path = checkout) -> dict:
                out = work / "latency-out"
                shutil.rmtree(out, ignore_errors=True)
                result = timed(pack_command(mount, out, args.workers), env=imgpipe_env(checkout), memory=True)
                shutil.rmtree(out)
                return result

            runs[name] = run
        results = alternate(runs, args.rounds)
    report(results, files, "16-thread read", machine_note())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("travel", "cold", "throttled", "latency"))
    parser.add_argument("--root", default="/var/tmp/imgpipe-bench", help="where the trees and images go (this machine's own disk)")
    parser.add_argument("--baseline", help="another imgpipe checkout to measure the same way (the 'before')")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--classes", type=int, default=None)
    parser.add_argument("--per-class", type=int, default=None)
    parser.add_argument("--val", type=int, default=None, help="flat val files (cold, throttled, latency)")
    parser.add_argument("--val-per-class", type=int, default=1, help="travel: synth's val images per class")
    parser.add_argument("--iops", type=int, default=1000)
    parser.add_argument("--bps", type=int, default=20 * 10**6)
    parser.add_argument("--delay-ms", type=float, default=3.0)
    parser.add_argument("--fuse-python", help="latency: the python of a venv with fusepy")
    args = parser.parse_args(argv)
    defaults = {"travel": (100, 50, 0), "cold": (100, 1281, 5000), "throttled": (20, 1000, 1000), "latency": (20, 500, 1000)}[args.what]
    args.classes, args.per_class, args.val = (
        given if given is not None else d for given, d in zip((args.classes, args.per_class, args.val), defaults)
    )
    if os.geteuid() != 0:
        raise SystemExit("run as root: it drops caches, mounts loop devices and FUSE, and sets blkio throttles")
    compile_bytecode()
    if args.baseline:
        compileall.compile_dir(Path(args.baseline) / "imgpipe", quiet=1)
    tempfile.tempdir = args.root
    Path(args.root).mkdir(parents=True, exist_ok=True)
    {"travel": run_travel, "cold": run_cold, "throttled": run_throttled, "latency": run_latency}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
