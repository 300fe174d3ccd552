"""Two packs on one DST: the lock comes before anything is deleted, and the second run names the first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hooks.faults import gate_env, wait_at_gate
from PIL import Image

from imgpipe.errors import PackError
from imgpipe.format.verify import verify
from imgpipe.packing.journal import JOURNAL_DIR
from imgpipe.packing.packer import pack


def imgpipe(*args: object, **kwargs) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "imgpipe", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


@pytest.fixture
def blocking_tree(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A class-folder tree whose last image is not an image, and the environment of a pack that stops once it has read
    that file, until the test lets it go on (``wait_at_gate``)."""
    src = tmp_path / "src"
    for name in ("A", "B"):
        (src / name).mkdir(parents=True)
        for k in range(3):
            Image.new("RGB", (32, 24), (k * 40, 0, 0)).save(src / name / f"{k}.jpg")
    (src / "B" / "zz.jpg").write_bytes(b"not a jpeg")
    return src, gate_env(dict(os.environ), tmp_path / "gate", "zz.jpg")


@pytest.mark.timeout(120)
def test_a_second_pack_on_a_locked_dst_names_the_first_and_deletes_nothing(blocking_tree, tmp_path: Path) -> None:
    src, env = blocking_tree
    dst = tmp_path / "dst"
    first = imgpipe("pack", src, dst, "--no-shuffle", "--shards", "2", "--workers", "1", env=env)
    try:
        gate = wait_at_gate(tmp_path / "gate", process=first)  # shard 0 is done, shard 1 waits after reading zz.jpg
        waiting = [dst / JOURNAL_DIR / "train-00000-of-00002.json", dst / JOURNAL_DIR / "slots" / "train-00001-of-00002.rec"]
        assert all(p.exists() for p in waiting), sorted(p.name for p in dst.rglob("*"))
        before = {p.name for p in dst.rglob("*")}
        for extra in (["--overwrite"], [], ["--seed", "5", "--overwrite"]):  # whatever its options
            second = subprocess.run(  # run() kills it if it times out
                [sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), "--no-shuffle", "--shards", "2", "--workers", "1", *extra],
                capture_output=True,
                text=True,
                timeout=60,
            )
            err = second.stderr
            assert second.returncode != 0
            assert f"imgpipe: error: another imgpipe pack is writing {dst} (pid {first.pid}); wait for it to finish or stop it" in err, err
            assert "Traceback" not in err and "--overwrite" not in err
        assert before <= {p.name for p in dst.rglob("*")}  # nothing of the first pack was deleted
        os.close(gate)  # let the first pack go on
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        assert "B/zz.jpg: not an image" in out
    finally:
        if first.poll() is None:  # a failed assertion must not leave the pack waiting at its gate
            first.kill()
            first.wait()
    assert verify(dst, workers=1, progress=False).ok


@pytest.mark.timeout(60)
def test_multi_node_option_mismatch_advises_emptying_dst_not_overwrite(synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    pack(synth_tree, dst, shards=2, num_nodes=2, node_rank=0, workers=1, progress=False)
    with pytest.raises(
        PackError, match=r"different options \(seed 0 -> 3\): empty DST \(or choose another\), then start every node"
    ) as info:
        pack(synth_tree, dst, shards=2, seed=3, num_nodes=2, node_rank=1, workers=1, progress=False)
    assert "--overwrite" not in str(info.value)


@pytest.mark.timeout(60)
def test_a_finished_pack_without_its_journal_is_recognised_from_its_manifest(packed_dir: Path, synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "copy"
    shutil.copytree(packed_dir, dst, ignore=shutil.ignore_patterns(".*"))  # a copy that skips dot-folders
    files = {p.name: p.stat().st_mtime_ns for p in dst.iterdir()}
    report = pack(synth_tree, dst, shards="train=2,val=1", workers=1, progress=False)
    assert report.records == {"train": 48, "val": 12} and report.shards_written == 0 and report.shards_reused == 3
    assert {p.name: p.stat().st_mtime_ns for p in dst.iterdir() if p.name != JOURNAL_DIR} == files
    with pytest.raises(
        PackError,
        match=r"different options \(seed 0 -> 4\) \(from its manifest.json; the journal .imgpipe-pack/ is gone\): pass --overwrite",
    ):
        pack(synth_tree, dst, shards="train=2,val=1", seed=4, workers=1, progress=False)


@pytest.mark.timeout(60)
def test_overwrite_waits_for_no_node_while_another_node_writes(synth_tree: Path, tmp_path: Path) -> None:
    from imgpipe.packing.journal import Journal

    dst = tmp_path / "out"
    pack(synth_tree, dst, shards=2, num_nodes=2, node_rank=0, workers=1, progress=False)
    fd = Journal(dst).lock(1)  # node 1 of that pack is writing (here: this process holds its lock)
    try:
        with pytest.raises(PackError, match=rf"another imgpipe pack is writing {dst} \(pid {os.getpid()}\)"):
            pack(synth_tree, dst, shards=3, overwrite=True, workers=1, progress=False)
        assert len(list(dst.glob("*.rec"))) == 2  # node 0's shards are still there
    finally:
        os.close(fd)
    pack(synth_tree, dst, shards=3, overwrite=True, workers=1, progress=False)
    assert len(list(dst.glob("*.rec"))) == 6


def test_a_file_where_the_journal_goes_is_one_line(synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / JOURNAL_DIR).write_text("not a folder")
    with pytest.raises(PackError, match=r"\.imgpipe-pack: cannot make the pack journal there \(File exists\); move that file away"):
        pack(synth_tree, dst, workers=1, progress=False)


@pytest.mark.timeout(60)
def test_another_nodes_plan_half_written_is_not_an_unknown_pack(synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    (dst / JOURNAL_DIR).mkdir(parents=True)
    (dst / JOURNAL_DIR / ".plan.json.x1y2.tmp").write_text("{")  # node 0 is writing plan.json (atomic write) right now
    first = pack(synth_tree, dst, shards=2, num_nodes=2, node_rank=1, workers=1, progress=False)
    assert first.shards_written == 2


HOLD_AND_FORK = """
import os, sys
from pathlib import Path
from imgpipe.packing.journal import Journal
fd = Journal(Path(sys.argv[1])).lock(0)
child = os.fork()  # as pack forks its workers
if child == 0:
    sys.stdin.readline()
    os._exit(0)
print(child, flush=True)
sys.stdin.readline()
"""


@pytest.mark.timeout(60)
def test_a_killed_packs_forked_workers_keep_dst_locked_until_they_exit(tmp_path: Path) -> None:
    """The lock is an flock on a descriptor the workers inherit: a pack killed with kill -9 leaves no gap in which a
    second pack could start while its workers may still write DST (the reason pidlock is not filelock, whose fork
    hook closes the lock's descriptor in every child)."""
    from imgpipe._sys.pidlock import is_held
    from imgpipe.packing.journal import Journal

    dst = tmp_path / "dst"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_FORK, str(dst)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lock = dst / JOURNAL_DIR / "node-0.lock"
    try:
        assert holder.stdout is not None and int(holder.stdout.readline()) > 0
        holder.kill()
        holder.wait(timeout=30)
        assert is_held(lock)  # the worker holds it still
        with pytest.raises(PackError, match=rf"another imgpipe pack is writing {dst} \(pid {holder.pid}\)"):
            Journal(dst).lock(0, wait_s=0.2)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the worker reads EOF and exits
    deadline = time.monotonic() + 30
    while is_held(lock):
        assert time.monotonic() < deadline, "the worker did not let go"
        time.sleep(0.02)
    os.close(Journal(dst).lock(0, wait_s=0))
