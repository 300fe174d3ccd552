"""A pack split over SLURM array tasks: which part each task writes, a killed task rerun alone, finalize naming what is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import assert_one_line_error
from _hooks.faults import gate_env, wait_at_gate
from PIL import Image

from imgpipe.cli.data import node_identity
from imgpipe.errors import PackError
from imgpipe.format.verify import verify
from imgpipe.packing.journal import JOURNAL_DIR, Journal
from imgpipe.packing.packer import pack
from imgpipe.packing.parts import ArrayTask, Parts, choose_part

PACK_OPTIONS = ("--no-shuffle", "--shards", "6", "--workers", "1")


def array_env(task_id: int, first: int, last: int, step: int = 1, **more: str) -> dict[str, str]:
    """What sbatch sets in the batch step of one array task (one node: SLURM_NNODES=1, SLURM_NODEID=0)."""
    count = (last - first) // step + 1
    env = {"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": str(task_id), "SLURM_ARRAY_TASK_MIN": str(first)}
    env |= {"SLURM_ARRAY_TASK_MAX": str(last), "SLURM_ARRAY_TASK_STEP": str(step), "SLURM_ARRAY_TASK_COUNT": str(count)}
    return env | {"SLURM_JOB_ID": str(100 + task_id), "SLURM_NNODES": "1", "SLURM_NODEID": "0"} | more


def test_an_array_task_picks_its_part_from_its_id_and_the_arrays_first_id() -> None:
    assert node_identity(None, None, array_env(3, 1, 8)) == (1, 0, ArrayTask(3, 1, 1, 8))
    assert choose_part(1, 0, ArrayTask(3, 1, 1, 8), None)[:2] == (8, 2)  # --array=1-8: task 3 writes part 2
    assert choose_part(1, 0, ArrayTask(8, 0, 4, 3), None)[:2] == (3, 2)  # --array=0-8:4 is tasks 0, 4, 8
    assert choose_part(1, 0, ArrayTask(1, 0, 1, 2, nodes=3, node_id=2), None)[:2] == (6, 5)  # srun -N 3 inside each task
    first = Parts.of_array(ArrayTask(0, 1, 1, 8))
    assert choose_part(1, 0, ArrayTask(3, 3, 1, 1), first)[:2] == (8, 2)  # sbatch --array=3 alone: still part 2 of 8
    with pytest.raises(PackError, match=r"SLURM_ARRAY_TASK_ID=9 .* is not one of this pack's 8 part\(s\) \(array tasks 1-8\)"):
        choose_part(1, 0, ArrayTask(9, 9, 1, 1), first)
    with pytest.raises(PackError, match=r"SLURM_ARRAY_TASK_ID=2 .* is not one of this pack's 3 part\(s\) \(array tasks 0-8:4\)"):
        choose_part(1, 0, ArrayTask(2, 0, 4, 3), None)


def test_the_options_win_over_an_array_and_the_array_over_the_batch_steps_one_node() -> None:
    env = array_env(2, 0, 3)  # sbatch also sets SLURM_NNODES=1 and SLURM_NODEID=0: they must not make it a one-node pack
    assert node_identity(None, None, env)[2] == ArrayTask(2, 0, 1, 4)
    assert node_identity(4, 1, env) == (4, 1, None)
    with pytest.raises(PackError, match=r"give both, or neither to take the part from the array \(SLURM_ARRAY_TASK_ID=2 \(MIN 0"):
        node_identity(4, None, env)
    with pytest.raises(PackError, match=r"SLURM_ARRAY_TASK_COUNT='x' is not an integer; give --num-nodes and --node-rank"):
        node_identity(None, None, env | {"SLURM_ARRAY_TASK_COUNT": "x"})
    without_count = {k: v for k, v in env.items() if k != "SLURM_ARRAY_TASK_COUNT"}  # older SLURM: from MIN, MAX and STEP
    assert node_identity(None, None, without_count)[2] == ArrayTask(2, 0, 1, 4)


@pytest.mark.timeout(60)
def test_a_run_that_splits_the_pack_another_way_is_refused(synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    pack(synth_tree, dst, shards=6, workers=1, progress=False, array_task=ArrayTask(0, 0, 1, 3))
    assert Journal(dst).read_parts() == Parts(3, 0, 1, 1)
    for nodes, rank in ((2, 1), (1, 0)):  # either would write shards that tasks 1 and 2 write
        with pytest.raises(PackError, match=r"is being packed in 3 parts \(by SLURM array tasks\), this run would split it in"):
            pack(synth_tree, dst, shards=6, workers=1, progress=False, num_nodes=nodes, node_rank=rank)
    assert len(list(dst.glob("*.rec"))) == 4  # part 0's shards only
    report = pack(synth_tree, dst, shards=6, workers=1, progress=False, num_nodes=3, node_rank=1)
    assert report.shards_written == 4


def make_tree(root: Path) -> None:
    """Class folders A..F of 4 images, the last not an image (skipped): a pack run with ``gate_env`` waits after reading it."""
    for k, name in enumerate("ABCDEF"):
        (root / name).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (40 + i, 32), (k * 40, i * 60, 90)).save(root / name / f"{i}.jpg")
    (root / "F" / "last.jpg").write_bytes(b"not a jpeg")


def run_pack(src: Path, dst: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), *PACK_OPTIONS, *extra, "--no-progress"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def shard_files(dst: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dst.glob("*-of-*.*") if not p.name.startswith(".")}


@pytest.mark.timeout(240)
def test_array_tasks_one_killed_and_rerun_alone_then_finalize_equal_one_machine(tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    src = tmp_path / "src"
    single = tmp_path / "single"
    assert run_pack(src, single).returncode == 0

    # sbatch --array=1-3: tasks 1..3 write parts 0..2; last.jpg is the last image, in shard 5 of 0..5: part 2, task 3
    dst = tmp_path / "multi"
    command = [sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), *PACK_OPTIONS, "--no-progress"]
    gated = gate_env(dict(os.environ), tmp_path / "gate", "last.jpg")
    tasks = {
        task: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**(gated if task == 3 else os.environ), **array_env(task, 1, 3)})
        for task in (1, 2, 3)
    }  # fmt: skip
    try:
        for task in (1, 2):
            out, err = tasks[task].communicate(timeout=120)
            assert tasks[task].returncode == 0, err
            assert f"part {task - 1} of 3, from SLURM_ARRAY_TASK_ID={task} (MIN 1, STEP 1, COUNT 3)" in err
            assert "wrote 2 shard(s)" in out
        journal = dst / JOURNAL_DIR
        os.close(wait_at_gate(tmp_path / "gate", process=tasks[3]))  # task 3 wrote shard 2 and waits in shard 5
        assert (journal / "train-00002-of-00006.json").exists() and tasks[3].poll() is None
        tasks[3].send_signal(signal.SIGKILL)
        tasks[3].wait()
    finally:
        for process in tasks.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    assert not (journal / "train-00005-of-00006.json").exists() and not (dst / "manifest.json").exists()
    before = shard_files(dst)
    assert "train-00002-of-00006.rec" in before and "train-00005-of-00006.rec" not in before

    finalize = run_pack(src, dst, "--finalize")
    assert_one_line_error(
        finalize,
        "1 shard(s) are not written yet (e.g. train-00005-of-00006)",
        "part(s) 2 of 3 are missing; resubmit array task(s) 3 (sbatch --array=3 YOUR_PACK_SCRIPT) "
        "or run the same imgpipe pack command with --num-nodes 3 and --node-rank 2, then --finalize",
    )

    rerun = run_pack(src, dst, env=array_env(3, 3, 3))  # sbatch --array=3: MIN 3, COUNT 1, and still part 2 of 3
    assert rerun.returncode == 0, rerun.stderr
    assert "part 2 of 3, from SLURM_ARRAY_TASK_ID=3 (MIN 3, STEP 1, COUNT 1)" in rerun.stderr
    assert "shards: 1 written, 1 already done, 6 in the plan" in rerun.stdout, rerun.stdout
    assert {name: shard_files(dst).get(name) for name in before} == before  # no other shard was written again

    finalized = run_pack(src, dst, "--finalize")
    assert finalized.returncode == 0, finalized.stderr
    output = {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.is_file()}
    assert output == {p.name: p.read_bytes() for p in sorted(single.iterdir()) if p.is_file()}
    assert "last.jpg" in (dst / "manifest.json").read_text()  # skipped, alike in both packs


@pytest.mark.timeout(10)
def test_a_task_outside_an_array_of_a_trillion_parts_is_one_line_at_once() -> None:
    """The refusal names the array's task ids as sbatch takes them, without listing them one by one."""
    recorded = Parts(10**12, 0, 2, 1)  # parts.json of a first run under SLURM_ARRAY_TASK_COUNT=1000000000000
    with pytest.raises(PackError, match=r"is not one of this pack's 1000000000000 part\(s\) \(array tasks 0-1999999999998:2\)"):
        choose_part(1, 0, ArrayTask(1, 1, 1, 1), recorded)
    assert Parts(2, 5, 3, 1).task_ids(range(2)) == "5,8" and Parts(3, 5, 3, 2).task_ids(range(6)) == "5-11:3"


@pytest.mark.parametrize("step", ["0", "-2"])
def test_an_array_step_below_one_is_one_line(step: str) -> None:
    with pytest.raises(PackError, match=rf"SLURM_ARRAY_TASK_STEP={step} is not an array's step \(1 or more\); give --num-nodes"):
        node_identity(None, None, array_env(2, 0, 4) | {"SLURM_ARRAY_TASK_STEP": step})


def pack_task(src: Path, dst: Path, task: int, **options: object):
    """Task ``task`` of ``sbatch --array=0-2``, in this process."""
    return pack(src, dst, shards=3, workers=1, progress=False, array_task=ArrayTask(task, 0, 1, 3), **options)


def finalize(src: Path, dst: Path):
    return pack(src, dst, shards=3, workers=1, progress=False, finalize=True)


@pytest.fixture(scope="module")
def single(synth_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of the same pack on one machine."""
    dst = tmp_path_factory.mktemp("single") / "out"
    pack(synth_tree, dst, shards=3, workers=1, progress=False)
    return {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()}


def outputs(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()}


@pytest.mark.timeout(120)
def test_the_last_part_refuses_a_manifest_over_a_shard_cut_since_and_names_the_part(
    synth_tree: Path, tmp_path: Path, single: dict[str, bytes]
) -> None:
    """Tasks 0 and 1 finish; one of task 0's shards is cut to 100 bytes. Task 2 writes its own shards, then
    refuses the manifest in one line naming the shard and the task to rerun; so does --finalize. Once task 0
    runs again, the pack ends byte-identical to one machine's."""
    dst = tmp_path / "out"
    for task in (0, 1):
        pack_task(synth_tree, dst, task)
    cut = dst / "train-00000-of-00003.rec"  # shard 0 of 0..5: part 0
    cut.write_bytes(cut.read_bytes()[:100])
    with pytest.raises(PackError) as info:
        pack_task(synth_tree, dst, 2)
    assert str(info.value) == (
        f"{dst}: shard train-00000-of-00003 changed since it was written (train-00000-of-00003.rec is 100 bytes, the journal says "
        f"{len(single[cut.name])}; 1 shard(s) in all); no manifest.json was written; part(s) 0 of 3 must write it again: "
        "resubmit array task(s) 0 (sbatch --array=0 YOUR_PACK_SCRIPT) or run the same imgpipe pack command with --num-nodes 3 "
        "and --node-rank 0, then --finalize"
    )
    assert not (dst / "manifest.json").exists() and not verify(dst, workers=1, progress=False).ok
    with pytest.raises(PackError, match=r"part\(s\) 0 of 3 are missing; resubmit array task\(s\) 0 "):
        finalize(synth_tree, dst)
    assert not (dst / "manifest.json").exists()
    rerun = pack_task(synth_tree, dst, 0)
    assert rerun.shards_written == 1 and rerun.manifest is not None
    assert outputs(dst) == single


@pytest.mark.timeout(120)
def test_finalize_refuses_a_manifest_over_a_shard_changed_in_place_and_the_part_that_owns_it_rewrites_it(
    synth_tree: Path, tmp_path: Path, single: dict[str, bytes]
) -> None:
    """Every part is written but the manifest is not (the last task was killed as it finalized), and one byte
    of a shard changed, its size the same: --finalize refuses naming it; the part that owns it writes it again."""
    dst = tmp_path / "out"
    for task in (0, 1, 2):
        pack_task(synth_tree, dst, task)
    (dst / "manifest.json").unlink()
    changed = dst / "val-00001-of-00003.rec"  # shard 4 of 0..5: part 1
    data = bytearray(changed.read_bytes())
    data[-10] ^= 1
    changed.write_bytes(bytes(data))
    refused = r"shard val-00001-of-00003 changed since it was written \(val-00001-of-00003.rec's sha256 differs from the journal's; "
    with pytest.raises(PackError, match=refused + r"1 shard\(s\) in all\); no manifest.json was written; part\(s\) 1 of 3 must write"):
        finalize(synth_tree, dst)
    assert not (dst / "manifest.json").exists()
    report = pack_task(synth_tree, dst, 1)  # the owner: a shard of its own is written again, then the manifest
    assert report.shards_written == 1 and report.manifest is not None
    assert outputs(dst) == single


@pytest.mark.timeout(120)
def test_a_part_rewrites_its_own_changed_shard_before_the_manifest(
    synth_tree: Path, tmp_path: Path, single: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    dst = tmp_path / "out"
    for task in (0, 1, 2):
        pack_task(synth_tree, dst, task)
    (dst / "manifest.json").unlink()  # task 2 was killed as it finalized
    changed = dst / "train-00002-of-00003.rec"  # shard 2: part 2's own
    data = bytearray(changed.read_bytes())
    data[-10] ^= 1
    changed.write_bytes(bytes(data))
    report = pack_task(synth_tree, dst, 2)
    assert report.manifest is not None and (report.shards_written, report.shards_reused) == (1, 1)
    assert "train-00002-of-00003: train-00002-of-00003.rec's sha256 differs from the journal's; writing it again" in caplog.text
    assert outputs(dst) == single


HOLD_PART = """
import sys
from pathlib import Path
from imgpipe.packing.journal import Journal
fd = Journal(Path(sys.argv[1])).lock(int(sys.argv[2]))
print("holding", flush=True)
sys.stdin.readline()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("part", [2, 0])
def test_finalize_while_a_part_is_being_written_says_so_with_its_pid(synth_tree: Path, tmp_path: Path, part: int) -> None:
    """Part 0 too: --finalize takes part 0's lock, and while task 0 held it the line was 'another imgpipe pack is writing
    DST (pid N); wait for it to finish or stop it, then rerun', not which part, nor --finalize."""
    dst = tmp_path / "out"
    for task in {0, 1, 2} - {part}:
        pack_task(synth_tree, dst, task)
    holder = [sys.executable, "-c", HOLD_PART, str(dst), str(part)]
    writer = subprocess.Popen(holder, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:  # the task runs: it holds its part's lock
        assert writer.stdout is not None and writer.stdout.readline().strip() == "holding"
        with pytest.raises(PackError) as info:
            finalize(synth_tree, dst)
        assert str(info.value) == (
            f"{dst}: 2 shard(s) are not written yet (e.g. train-0000{part}-of-00003); part {part} of 3 is still being written "
            f"(pid {writer.pid}); wait for it to finish, then --finalize"
        )
    finally:
        writer.kill()
        writer.wait(timeout=30)
    with pytest.raises(PackError, match=rf"part\(s\) {part} of 3 are missing; resubmit array task\(s\) {part}"):
        finalize(synth_tree, dst)


HOLD_PART_WRITING = """
import sys
from pathlib import Path
from imgpipe.packing.journal import Journal
dst = Path(sys.argv[1])
fd = Journal(dst).lock(int(sys.argv[2]))
for name in sys.argv[3:]:
    (dst / name).write_bytes(b"half a shard")
print("writing", flush=True)
sys.stdin.readline()
"""


@pytest.mark.timeout(120)
def test_finalize_leaves_the_temp_files_of_a_part_being_written(synth_tree: Path, tmp_path: Path, single: dict[str, bytes]) -> None:
    """Task 2 holds its lock and writes its shards' temp files (a shard being compacted, the journal entry's atomic
    write): --finalize says to wait and deletes none of them (task 2 renames them into place next). Task 2, killed
    instead, removes its own when rerun."""
    dst = tmp_path / "out"
    for task in (0, 1):
        pack_task(synth_tree, dst, task)
    temps = [".train-00002-of-00003.rec.tmp", ".train-00002-of-00003.idx.tmp", f"{JOURNAL_DIR}/.train-00002-of-00003.json.x1.tmp"]
    writer = subprocess.Popen(
        [sys.executable, "-c", HOLD_PART_WRITING, str(dst), "2", *temps], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        with pytest.raises(PackError, match=rf"part 2 of 3 is still being written \(pid {writer.pid}\); wait for it to finish"):
            finalize(synth_tree, dst)
        assert [name for name in temps if not (dst / name).exists()] == []
    finally:
        writer.kill()
        writer.wait(timeout=30)
    assert pack_task(synth_tree, dst, 2).manifest is not None
    assert outputs(dst) == single
