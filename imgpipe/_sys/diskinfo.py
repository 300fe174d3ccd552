"""What a path is stored on: block device, mount point, filesystem, rotational or network.

The mounts come from ``psutil.disk_partitions(all=True)``, rotational from
``/sys/block/*/queue/rotational`` (Linux; elsewhere None). Used by ``imgpipe pack`` (free space, SSD
advice, how to read the source) and by ``imgpipe bench`` (is the data on slow storage?).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

from imgpipe.errors import ImgpipeError, PackError

logger = logging.getLogger(__name__)

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb",
        "smb3",
        "smbfs",
        "fuse.sshfs",
        "sshfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "fuse.ceph",
        "fuse.cephfs",
        "glusterfs",
        "fuse.glusterfs",
        "afs",
        "9p",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "fuse.juicefs",
        "ocfs2",
        "wekafs",
        "virtiofs",
        "panfs",
        "pvfs2",
        "orangefs",
    }
)


@dataclass(frozen=True)
class DiskInfo:
    """Where a path lives. ``rotational`` is None when it cannot be told (e.g. tmpfs, overlay)."""

    device: str
    mountpoint: str
    fstype: str
    rotational: bool | None
    network: bool

    @property
    def slow(self) -> bool:
        """True for spinning disks and network filesystems: random reads there are costly."""
        return bool(self.rotational) or self.network


class Mount(NamedTuple):
    """One mounted file system, as ``psutil.disk_partitions`` gives it."""

    device: str
    mountpoint: str
    fstype: str


def mounts() -> list[Mount]:
    """Every mount of this machine, pseudo file systems included (``all=True``: tmpfs, NFS, FUSE); [] where none can be read."""
    import psutil

    try:
        return [Mount(p.device, p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True)]
    except OSError:
        return []


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _rotational(device: str, sys_block: Path) -> bool | None:
    """Look the device up in /sys/block (partitions resolve to their disk; dm/md use their slaves)."""
    if not device.startswith("/dev/"):
        return None
    try:
        real = Path(os.path.realpath(device))
        dev_link = Path("/sys/class/block") / real.name
        node = Path(os.path.realpath(dev_link)) if dev_link.exists() else None
    except OSError:
        node = None
    candidates = []
    if node is not None:
        candidates += [node / "queue" / "rotational", node.parent / "queue" / "rotational"]
    candidates.append(sys_block / Path(device).name / "queue" / "rotational")
    for candidate in candidates:
        try:
            return candidate.read_text().strip() == "1"
        except OSError:
            continue
    return None


def device_for_path(
    path: str | os.PathLike, *, mounted: Sequence[Mount] | None = None, sys_block: str | os.PathLike = "/sys/block"
) -> DiskInfo:
    """Find the mount holding ``path`` (which need not exist yet) among ``mounted`` (this machine's ``mounts()``
    when None) and describe its device."""
    target = os.path.realpath(os.path.abspath(path))  # non-strict: a path that does not exist yet is fine
    best: Mount | None = None
    for device, mountpoint, fstype in mounts() if mounted is None else mounted:
        inside = target == mountpoint or target.startswith(mountpoint.rstrip("/") + "/")
        if inside and (best is None or len(mountpoint) >= len(best[1])):
            best = Mount(device, mountpoint, fstype)
    if best is None:
        return DiskInfo(device="", mountpoint="/", fstype="", rotational=None, network=False)
    device, mountpoint, fstype = best
    network = fstype in NETWORK_FILESYSTEMS or fstype.startswith("nfs") or (":" in device and fstype.startswith("fuse"))
    return DiskInfo(device, mountpoint, fstype, None if network else _rotational(device, Path(sys_block)), network)


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes available to this user on the filesystem holding ``path`` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing_ancestor(Path(path))).free


def format_bytes(n: float) -> str:
    """A byte count in the unit that fits, in powers of 1000: ``512 B``, ``12.3 MB``, ``1.5 TB``."""
    unit = "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            break
        n /= 1000
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"


def check_free_space(path: str | os.PathLike, needed: int, *, what: str = "the output", error: type[ImgpipeError] = PackError) -> None:
    """Raise ``error`` (a PackError unless told) if ``needed`` bytes do not fit on the filesystem holding ``path``."""
    free = free_bytes(path)
    if needed > free:
        shown = (format_bytes(needed), format_bytes(free))
        if shown[0] == shown[1]:  # too close to tell apart at this precision
            shown = (f"{needed:,} bytes", f"{free:,} bytes")
        raise error(f"{path}: {what} needs about {shown[0]} but only {shown[1]} is free there; free some space or choose another DST")


def warn_if_slow(
    path: str | os.PathLike, *, role: str = "DST", mounted: Sequence[Mount] | None = None, sys_block: str | os.PathLike = "/sys/block"
) -> DiskInfo:
    """Log a warning with SSD advice when ``path`` is on a rotational disk or a network filesystem."""
    info = device_for_path(path, mounted=mounted, sys_block=sys_block)
    if info.network:
        logger.warning(
            "%s %s is on a network filesystem (%s at %s): reads and writes will be slow; use a local SSD if you can",
            role,
            path,
            info.fstype,
            info.mountpoint,
        )
    elif info.rotational:
        logger.warning("%s %s is on a rotational disk (%s): random reads will be slow; use an SSD if you can", role, path, info.device)
    return info
