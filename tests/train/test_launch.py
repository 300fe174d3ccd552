"""launch(): one process, N spawned gloo ranks, torchrun-style env, failures named by rank, no orphans."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from imgpipe._sys.cpus import available_cpus
from imgpipe.errors import DistributedError
from imgpipe.train.launch import check_launcher_env
from imgpipe.train.local_ranks import cpu_threads, diagnose

sys.path.insert(0, str(Path(__file__).parent))
from proctree import descendants, quiet_env, rank_processes, wait_gone  # noqa: E402

HELPER = str(Path(__file__).parent / "launch_helper.py")


def run_helper(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, HELPER, *args], env=env or quiet_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("env", [{"RANK": "0"}, {"WORLD_SIZE": "2"}, {"LOCAL_RANK": "1"}, {"RANK": "1", "LOCAL_RANK": "1"}])
def test_partial_launcher_env_is_one_clear_error(env: dict[str, str]) -> None:
    with pytest.raises(DistributedError, match="start with torchrun"):
        check_launcher_env(env)


def test_complete_envs_pass() -> None:
    check_launcher_env({})
    check_launcher_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    check_launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "LOCAL_RANK": "0"})


@pytest.mark.timeout(120)
def test_plain_run_is_one_process_without_a_group() -> None:
    done = run_helper("ok")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {
        "rank": 0,
        "world_size": 1,
        "source": "single",
        "device": "cpu",
        "backend": None,
        "sum": 1.0,
        "ranks": [0],
        "threads": 1,
    }


@pytest.mark.timeout(120)
def test_only_rank_set_fails_with_one_line_not_keyerror() -> None:
    done = run_helper("ok", env=quiet_env(RANK="1"))
    assert done.returncode == 1
    assert "KeyError" not in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "imgpipe: error: RANK set but WORLD_SIZE not: start with torchrun (or --gpus N / --nproc N), "
        "or unset these variables to run one process"
    ]


@pytest.mark.timeout(120)
def test_torchrun_env_without_master_addr_names_the_variable() -> None:
    done = run_helper("ok", env=quiet_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0"))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "MASTER_ADDR is not set for a 2-rank job (from torchrun)" in done.stderr


@pytest.mark.timeout(180)
def test_two_spawned_gloo_ranks() -> None:
    done = run_helper("ok", "--nproc", "2")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["rank"] == 0 and result["world_size"] == 2 and result["backend"] == "gloo"
    assert result["sum"] == 3.0  # 1 + 2 all-reduced
    assert [r for r, _ in result["ranks"]] == [0, 1]
    assert len({port for _, port in result["ranks"]}) == 1
    assert "leaked semaphore" not in done.stderr  # a rank's os._exit leaves no named semaphore behind


@pytest.mark.timeout(180)
def test_spawned_cpu_ranks_share_the_cores_unless_omp_num_threads_says() -> None:
    assert cpu_threads(2, {}) == max(1, available_cpus() // 2) and cpu_threads(64 * available_cpus(), {}) == 1
    assert cpu_threads(2, {"OMP_NUM_THREADS": "3"}) is None
    unset = {k: v for k, v in quiet_env().items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    threads = {}
    for name, env, nproc in (
        ("shared", unset, "2"),
        ("set", {**unset, "OMP_NUM_THREADS": "2"}, "2"),
        ("alone", {**unset, "OMP_NUM_THREADS": "2"}, "1"),
    ):
        done = run_helper("ok", "--nproc", nproc, env=env)
        assert done.returncode == 0, done.stderr
        threads[name] = json.loads(done.stdout)["threads"]
    assert threads["shared"] == max(1, available_cpus() // 2)
    assert threads["set"] == threads["alone"]  # OMP_NUM_THREADS kept: what one process with it gets


def run_watched(*args: str) -> tuple[int, str, set[int]]:
    """Run the helper to its end; (exit code, stderr, every descendant seen while it ran)."""
    proc = subprocess.Popen([sys.executable, HELPER, *args], env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        seen.update(descendants(proc.pid))
        time.sleep(0.2)
    return proc.wait(timeout=30), proc.stderr.read(), seen


@pytest.mark.timeout(120)
def test_finished_ranks_flush_their_output_and_stop_their_workers() -> None:
    # a finished rank skips the interpreter's teardown (os._exit), so it must do that teardown's duties itself
    env = {k: v for k, v in quiet_env().items() if k != "PYTHONUNBUFFERED"}  # buffered, as in a real run
    proc = subprocess.Popen(
        [sys.executable, HELPER, "leave", "--nproc", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=60)  # a worker left alive would hold the pipe open until then
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert json.loads(lines[-1])["sum"] == 3.0
    children = [int(line.split()[-1]) for line in lines if " left child " in line]
    assert len(children) == 2  # each rank's buffered line reached the pipe
    assert wait_gone(children, 10) == []  # and its worker did not outlive it


@pytest.mark.timeout(180)
def test_a_failing_rank_is_named_and_the_others_stopped() -> None:
    code, stderr, seen = run_watched("fail", "--nproc", "2")
    assert code == 1
    assert "rank 1 failed: rank one cannot go on: bad shard x.rec" in stderr, stderr
    assert len(seen) >= 2
    assert wait_gone(sorted(seen), 10) == []


@pytest.mark.timeout(180)
def test_a_hanging_rank_is_named_and_everyone_exits_after_the_timeout() -> None:
    start = time.monotonic()
    code, stderr, seen = run_watched("hang", "--nproc", "2", "--timeout", "4")
    assert code == 1
    assert "imgpipe: error: rank 1 hung: it did not reach the collective that rank 0 waited in for 4 s" in stderr, stderr
    assert "rank 0 failed" not in stderr  # rank 0 is the healthy one that timed out
    assert time.monotonic() - start < 150
    assert wait_gone(sorted(seen), 10) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_of_three_ranks_the_hung_one_is_named_not_the_two_that_timed_out() -> None:
    code, stderr, seen = run_watched("hang", "--nproc", "3", "--timeout", "4")
    assert code == 1
    assert "imgpipe: error: rank 1 hung: it did not reach the collective that ranks 0, 2 waited in for 4 s" in stderr, stderr
    assert wait_gone(sorted(seen), 10) == []


@pytest.mark.timeout(180)
def test_ranks_die_with_a_killed_launcher() -> None:
    """kill -9 of the launcher leaves no rank behind (``die_with_parent``), so no GPU stays held by an orphan, nor the
    launcher's folder of the run (the call, with its config, and the ranks' logs) in the temporary folder."""
    proc = subprocess.Popen(
        [sys.executable, HELPER, "wait", "--nproc", "2"], env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    waiting = {proc.stdout.readline().strip() for _ in range(2)}  # both ranks are inside their function
    assert waiting == {"rank 0 waiting", "rank 1 waiting"}
    ranks = rank_processes(proc.pid)
    assert len(ranks) == 2
    folder = Path(psutil.Process(ranks[0]).cmdline()[-1])  # python -m imgpipe.train.rank_main FOLDER
    assert (folder / "call.pkl").is_file()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    survivors = wait_gone(ranks, 15)
    for pid in survivors:  # do not leave them spinning if the check fails
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
    assert not folder.exists()


@pytest.mark.timeout(180)
def test_ranks_whose_workers_are_stuck_are_ended_at_the_grace_workers_and_all() -> None:
    """Each rank waits, in a C call where no signal handler runs, on a worker that stopped answering (SIGSTOP: a read on
    a hung mount). SIGTERM asks them to stop; at the grace (5 s here) each rank's whole process group is killed, and the
    launcher exits with one line and 143."""
    proc = subprocess.Popen(
        [sys.executable, HELPER, "stuck", "--nproc", "2"], env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    workers = sorted(int(proc.stdout.readline().split()[-1]) for _ in range(2))  # both ranks wait on a stopped worker
    seen = set(descendants(proc.pid))
    assert set(workers) <= seen and len(rank_processes(proc.pid)) == 2
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, stderr = proc.communicate(timeout=90)
    assert time.monotonic() - start < 5 + 30  # the grace, and a loaded machine's slack
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last == "imgpipe: stopped by SIGTERM: ranks 0, 1 did not stop within 5 s of SIGTERM: ended them and the workers", last
    assert wait_gone(sorted(seen), 10) == []  # the stopped workers too: no orphan left under init


def start_stuck_ranks() -> tuple[subprocess.Popen, dict[int, int], set[int]]:
    """The helper's 2 ranks, each waiting in a C call on a worker that stopped answering; (the launcher, rank -> its
    worker's pid, every descendant of the launcher)."""
    proc = subprocess.Popen(
        [sys.executable, HELPER, "stuck", "--nproc", "2"], env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    workers = {}
    for _ in range(2):
        words = proc.stdout.readline().split()  # "rank R stuck on worker PID"
        workers[int(words[1])] = int(words[-1])
    seen = set(descendants(proc.pid))
    assert set(workers.values()) <= seen and len(rank_processes(proc.pid)) == 2
    return proc, workers, seen


def ended(proc: subprocess.Popen, seen: set[int]) -> tuple[str, list[int]]:
    """The launcher's stderr once it exited, and those of ``seen`` still alive 10 s later (killed then: nothing is left
    behind when the check fails). Its stderr is read to the launcher's exit, not to EOF, which a leftover would hold off."""
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=90)
        reader.join(timeout=5)
        left = wait_gone(sorted(seen), 10)
    finally:
        for pid in [proc.pid, *seen]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return "".join(errors), left


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT])
def test_a_signal_torchs_agent_stops_the_ranks_on_leaves_none_of_their_stuck_workers(signum: int) -> None:
    """torch's agent ends the ranks on SIGHUP or SIGQUIT with that signal; the ranks died of it at once and their stuck
    workers, which it cannot reach, were left stopped under init."""
    proc, _, seen = start_stuck_ranks()
    proc.send_signal(signum)
    stderr, left = ended(proc, seen)
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == f"imgpipe: stopped by {signal.Signals(signum).name}: stopped every rank", stderr[-3000:]
    assert left == []


@pytest.mark.timeout(180)
def test_a_rank_killed_with_sigkill_is_named_and_leaves_none_of_its_stuck_workers() -> None:
    """The rank killed (by a user, the OOM killer) cannot end its worker, stopped in a read; nor can torch's agent, which
    signals only the ranks still running. Its worker was left stopped under init."""
    proc, workers, seen = start_stuck_ranks()
    os.kill(psutil.Process(workers[1]).ppid(), signal.SIGKILL)
    stderr, left = ended(proc, seen)
    assert proc.returncode == 1, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "imgpipe: error: rank 1 exited with code -9 (killed by SIGKILL)", stderr[-3000:]
    assert left == []


def test_of_ranks_that_died_without_a_report_the_first_to_die_is_named(tmp_path: Path) -> None:
    """Rank 1 killed with SIGKILL; rank 0, stuck, killed by torch's agent 30 s later (its own grace, 30 s too, came
    second): both died without a report, and the line named rank 0, the lower number."""
    failures = {}
    for rank, died_at in ((0, 1_000_030), (1, 1_000_000)):
        failures[rank] = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=-9, error_file=str(tmp_path / f"none-{rank}.json"))
        failures[rank].timestamp = died_at  # when torch's agent saw it: no error file to read it from
    assert diagnose(failures, 60.0) == ("rank 1 exited with code -9 (killed by SIGKILL)", "")
