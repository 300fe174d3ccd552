"""The OS chores of _sys, one helper each: a write whose length is checked (on a real full tmpfs), a file's
sha256, flock between processes, and the reset a forked child runs."""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _fs import PAGE, tmpfs  # noqa: E402

from imgpipe._sys.checksum import hash_range, hashed_blocks, sha256_file  # noqa: E402
from imgpipe._sys.forks import reset_after_fork  # noqa: E402
from imgpipe._sys.pidlock import is_held, lock_file, locked, try_lock  # noqa: E402
from imgpipe._sys.writes import write_at  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_a_write_the_disk_takes_in_part_is_an_error_not_a_short_count(tmp_path: Path) -> None:
    """On a tmpfs with room for 4 pages, pwrite of 8 pages comes back short: write_at writes the rest
    again and raises ENOSPC, so no caller can take the write for whole."""
    with tmpfs(tmp_path / "small", f"{4 * PAGE}") as small:
        data = os.urandom(8 * PAGE)
        fd = os.open(small / "f", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            assert os.pwrite(fd, data, 0) < len(data)  # the kernel's own answer: a short count, no error
            with pytest.raises(OSError) as info:
                write_at(fd, data, 0)
            assert info.value.errno == errno.ENOSPC
        finally:
            os.close(fd)
    path = tmp_path / "whole"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        write_at(fd, memoryview(data)[PAGE:], 5)
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(5) + data[PAGE:]


def test_a_files_sha256_is_hashlibs_whole_and_by_ranges(tmp_path: Path) -> None:
    data = os.urandom(9 << 20)  # more than one block
    path = tmp_path / "f"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert (
            hash_range(fd, 0, 5 << 20, digest) == 5 << 20 and hash_range(fd, 5 << 20, 12 << 20, digest) == 9 << 20
        )  # ends where the file does
    finally:
        os.close(fd)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    sent = hashlib.sha256()
    with open(path, "rb") as f:
        assert b"".join(hashed_blocks(f, 1 << 20, sent)) == data
    assert sent.hexdigest() == hashlib.sha256(data).hexdigest()


HOLD = """
import sys, time
from imgpipe._sys.pidlock import lock_file
fd = lock_file(sys.argv[1], shared=sys.argv[2] == "shared")
print("held", flush=True)
sys.stdin.readline()
"""


def test_flock_is_exclusive_or_shared_between_processes_and_dies_with_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), "shared"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert lock_file(lock, wait=False) is None and is_held(lock) and try_lock(lock) is None  # exclusive: refused
        shared = lock_file(lock, shared=True, wait=False)
        assert shared is not None  # shared beside a shared holder
        os.close(shared)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert not is_held(lock)  # the kernel let go with the process
    with locked(lock):
        assert lock_file(lock, wait=False) is None  # another descriptor is another holder
    fd = try_lock(lock)
    assert fd is not None and lock.read_text().split()[0] == str(os.getpid())
    os.close(fd)


class _Owner:
    def __init__(self) -> None:
        self.state = "the parent's"
        reset_after_fork(self, _Owner.reset)

    def reset(self) -> None:
        self.state = "reset"


def test_a_forked_child_resets_what_registered_and_the_parent_keeps_it() -> None:
    owner = _Owner()
    gone = weakref.ref(_Owner())
    gc.collect()
    assert gone() is None  # the registry keeps no owner alive
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, owner.state.encode())
        os._exit(0)
    os.close(write)
    assert os.waitpid(pid, 0)[1] == 0
    assert os.read(read, 100) == b"reset" and owner.state == "the parent's"
    os.close(read)
