"""`imgpipe train` end to end on CPU: 2 gloo ranks learn, torchrun, bit-exact resume, kill -9, SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from proctree import descendants, quiet_env, rank_processes, torchrun_logs, wait_gone
from train_cli import VAL_RECORDS, epochs_of, free_port, imgpipe_train, write_config

from imgpipe.train.loop import STOP_CHECK_STEPS

TORCHRUN = Path(sys.executable).parent / "torchrun"


def model_state(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


@pytest.fixture(scope="module")
def learned(packed: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    folder = tmp_path_factory.mktemp("learn")
    done = imgpipe_train(write_config(folder, packed, tensorboard=True), "--gpus", "0", "--nproc", "2")
    return done, folder / "run"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_learn_and_report_where_the_time_goes(learned: tuple[subprocess.CompletedProcess, Path]) -> None:
    done, run = learned
    assert done.returncode == 0, done.stderr[-3000:]
    epochs = epochs_of(run)
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert epochs[-1]["val_top1"] > 0.5  # chance is 0.25
    assert all(e["val_samples"] == VAL_RECORDS for e in epochs)
    assert all(e["train_samples"] == 160 for e in epochs)  # 5 steps x 16 x 2 ranks
    assert [r["rank"] for r in epochs[-1]["ranks"]] == [0, 1]
    out = done.stdout
    assert out.count(f"val: {VAL_RECORDS} samples") == 3
    assert out.count("rank   images/s  data-wait %  step p50 ms  step p95 ms") == 3
    table = out.split("rank   images/s")[-1].splitlines()
    assert [line.split()[0] for line in table[1:3]] == ["0", "1"]
    assert "load balance (slowest/fastest images/s)" in out
    assert out.count("done: 3 epoch(s), 15 steps") == 1  # only rank 0 prints
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["train"]["batch_size"] == 16 and saved["model"]["name"] == "resnet18"
    state = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert state["step"] == 15 and state["epoch"] == 3 and len(state["rng"]) == 2
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1  # rank 0 only
    assert b"step/loss_rank0" in events[0].read_bytes() and b"epoch/val_top1" in events[0].read_bytes()


def step_losses(run: Path) -> dict[int, float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["kind"] == "step"}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_interrupted_and_resumed_run_matches_the_uninterrupted_one(packed: Path, tmp_path: Path) -> None:
    """Resume mid-epoch: the same batches, optimizer, schedule and RNG as a run that never stopped.

    Usually bit-exact, but not always: two identical CPU processes here sometimes differ in the
    last bits of the very first step's loss (1.4e-7 relative once in ~6 runs, before any
    resume), as CPU float reductions are not reproducible across processes. So the weights
    are compared with rtol 1e-4 at a small lr (that noise stays ~1e-6), while any resume bug
    (another batch, lost momentum, a restarted schedule) moves weights and per-step losses by
    1e-2 or more.
    """
    whole = write_config(tmp_path / "whole", packed, base_lr=0.04, epochs=2, validate=False)
    parts = write_config(tmp_path / "parts", packed, base_lr=0.04, epochs=2, validate=False)
    uninterrupted = imgpipe_train(whole, "--gpus", "0", "--nproc", "2")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    first = imgpipe_train(parts, "--gpus", "0", "--nproc", "2", "--set", "train.max_steps=7")
    assert first.returncode == 0, first.stderr[-3000:]
    saved = torch.load(tmp_path / "parts" / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert (saved["epoch"], saved["epoch_step"], saved["step"]) == (1, 2, 7)  # mid-epoch
    assert saved["loader"]["batches"] == 2
    second = imgpipe_train(parts, "--gpus", "0", "--nproc", "2", "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "at epoch 1, step 7" in second.stderr
    expected, got = step_losses(tmp_path / "whole" / "run"), step_losses(tmp_path / "parts" / "run")
    assert sorted(got) == sorted(expected) == list(range(1, 11))
    for step in range(8, 11):  # the steps after the resume saw the same batches
        assert got[step] == pytest.approx(expected[step], rel=1e-4)
    resumed, reference = model_state(tmp_path / "parts" / "run"), model_state(tmp_path / "whole" / "run")
    assert resumed.keys() == reference.keys()
    far = [k for k in resumed if not torch.allclose(resumed[k].double(), reference[k].double(), rtol=1e-4, atol=1e-6)]
    assert far == []
    moved = max((resumed[k].double() - saved["model"][k].double()).abs().max().item() for k in resumed if resumed[k].is_floating_point())
    assert moved > 1e-3  # the last 3 steps really changed the weights, far beyond the tolerance


def step_lrs(run: Path) -> dict[int, float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["lr"] for r in map(json.loads, lines) if r["kind"] == "step"}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_saved_on_2_ranks_resumes_on_3_in_the_same_global_stream(packed: Path, tmp_path: Path) -> None:
    """G = 24 (train.global_batch_size, 12 x 2 ranks): 6 global steps per epoch. Stopped mid-epoch on 2 ranks,
    resumed on 3 with 8 per rank from the run's saved config.yaml, as docs/training.md shows it."""
    from imgpipe.train.config import load_config
    from imgpipe.train.optim import lr_schedule

    config = write_config(tmp_path, packed, epochs=2, validate=False)
    first = imgpipe_train(config, "--gpus", "0", "--nproc", "2", "--set", "train.global_batch_size=24", "--set", "train.max_steps=8")
    assert first.returncode == 0, first.stderr[-3000:]
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert (saved["epoch"], saved["epoch_step"], saved["global_batch"]) == (1, 2, 24)
    assert (saved["loader"]["batches"], saved["loader"]["global_batch"]) == (2, 24)
    second = imgpipe_train(tmp_path / "run" / "config.yaml", "--gpus", "0", "--nproc", "3", "--resume", "--set", "train.max_steps=null")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed at epoch 1, global batch 2, on 3 ranks (was 2); per-rank batch 8 (was 12)" in second.stderr
    done = torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert (done["epoch"], done["step"], done["world_size"], done["global_batch"]) == (2, 12, 3, 24)
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["batch_size"] == 8
    epoch1 = epochs_of(tmp_path / "run")[-1]
    assert epoch1["epoch"] == 1 and epoch1["train_samples"] == 4 * 24  # the 4 global batches after the resume, all ranks
    schedule = lr_schedule(load_config(config, ["train.global_batch_size=24"]), steps_per_epoch=6)
    lrs = step_lrs(tmp_path / "run")
    assert sorted(lrs) == list(range(1, 13))
    for step, lr in lrs.items():  # one schedule over global steps, across the change of rank count
        assert lr == pytest.approx(0.1 * 24 / 256 * schedule(step))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dali_run_resumed_mid_epoch_sees_the_batches_of_the_uninterrupted_one(packed: Path, tmp_path: Path) -> None:
    """The DALI loader resumes from its position in the global stream, as the torch loader does."""
    from imgpipe.loaders.dali import dali_available

    if not dali_available():
        pytest.skip("NVIDIA DALI is not installed")
    dali = ("--gpus", "0", "--set", "data.backend=dali")
    whole = write_config(tmp_path / "whole", packed, workers=1, base_lr=0.04, epochs=1, validate=False)
    parts = write_config(tmp_path / "parts", packed, workers=1, base_lr=0.04, epochs=1, validate=False)
    assert imgpipe_train(whole, *dali).returncode == 0
    assert imgpipe_train(parts, *dali, "--set", "train.max_steps=3").returncode == 0
    second = imgpipe_train(parts, *dali, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed at epoch 0, global batch 3, on 1 rank; per-rank batch 16" in second.stderr
    expected, got = step_losses(tmp_path / "whole" / "run"), step_losses(tmp_path / "parts" / "run")
    assert sorted(got) == sorted(expected) == list(range(1, 11))  # 160 records / batch 16 on one rank
    for step in range(4, 11):  # a restarted epoch would give other batches, and losses far apart
        assert got[step] == pytest.approx(expected[step], rel=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_run_under_torchrun(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed, epochs=1)
    cmd = [str(TORCHRUN), *torchrun_logs(tmp_path), "--standalone", "--nproc_per_node", "2",
           "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0"]  # fmt: skip
    done = subprocess.run(cmd, env=quiet_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"val: {VAL_RECORDS} samples") == 1
    assert done.stdout.count("done: 1 epoch(s), 5 steps") == 1
    assert [r["rank"] for r in epochs_of(tmp_path / "run")[0]["ranks"]] == [0, 1]


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_two_torchrun_nodes_on_localhost_then_resumed_on_one(packed: Path, tmp_path: Path) -> None:
    """``torchrun --nnodes 2 --nproc_per_node 2``: two node agents, c10d rendezvous, gloo, world size 4 (G = 4 x 4).

    Local ranks repeat on each node and global ranks do not: only global rank 0 prints, logs and
    writes the checkpoint, the per-rank table has ranks 0-3, and each node's ranks share the
    machine-wide ring allocation lock. Then the checkpoint resumes on one node of 2 ranks.
    """
    config = write_config(tmp_path, packed, workers=1, epochs=1, batch_size=4, validate=False)
    port = free_port()
    node = [str(TORCHRUN), *torchrun_logs(tmp_path),
            "--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
            "--rdzv_id", "imgpipe-2nodes", "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0"]  # fmt: skip
    agents = [subprocess.Popen(node, env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [agent.communicate(timeout=400) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(err[-2000:] for _, err in outs)
    stdout, stderr = "".join(out for out, _ in outs), "".join(err for _, err in outs)
    assert stdout.count("done: 1 epoch(s), 10 steps") == 1  # 160 records / G 16; printed by global rank 0 only
    assert stderr.count("checkpoint: ") == 1 and stderr.count("training resnet18 on 4 rank(s)") == 1
    assert [r["rank"] for r in epochs_of(tmp_path / "run")[0]["ranks"]] == [0, 1, 2, 3]
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert (saved["world_size"], saved["global_batch"], saved["step"], len(saved["rng"])) == (4, 16, 10, 4)
    assert list((tmp_path / "run").glob("*.tmp*")) == []  # one writer, atomic

    one = [str(TORCHRUN), *torchrun_logs(tmp_path),
           "--nnodes", "1", "--nproc_per_node", "2", "--standalone", "-m", "imgpipe", "train", "--config", str(config),
           "--gpus", "0", "--set", "train.epochs=2", "--resume"]  # fmt: skip
    done = subprocess.run(one, env=quiet_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed at epoch 1, global batch 0, on 2 ranks (was 4); per-rank batch 8 (was 4)" in done.stderr
    assert done.stdout.count("done: 2 epoch(s), 20 steps") == 1
    assert torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)["world_size"] == 2


def start_slurm_tasks(config: Path, tasks: int, **extra: str) -> list[subprocess.Popen]:
    """``tasks`` imgpipe train processes with the variables `srun --ntasks N` sets on one node, and the MASTER_* a job script exports."""
    slurm = {
        "SLURM_NTASKS": str(tasks),
        "SLURM_NPROCS": str(tasks),
        "SLURM_NODEID": "0",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS_PER_NODE": str(tasks),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        **extra,
    }
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0"]
    return [
        subprocess.Popen(
            cmd,
            env=quiet_env(**slurm, SLURM_PROCID=str(t), SLURM_LOCALID=str(t)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for t in range(tasks)
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_run_under_slurm(packed: Path, tmp_path: Path) -> None:
    """2 tasks started as `srun --ntasks 2` on one node starts them: SLURM's variables, plus the MASTER_* a job script exports."""
    config = write_config(tmp_path, packed, epochs=1)
    tasks = start_slurm_tasks(config, 2)
    outputs = [task.communicate(timeout=240) for task in tasks]
    for task, (_, stderr) in zip(tasks, outputs):
        assert task.returncode == 0, stderr[-3000:]
    assert outputs[0][0].count(f"val: {VAL_RECORDS} samples") == 1 and outputs[0][0].count("done: 1 epoch(s), 5 steps") == 1
    assert outputs[1][0] == ""  # only rank 0 prints
    assert [r["rank"] for r in epochs_of(tmp_path / "run")[0]["ranks"]] == [0, 1]
    assert epochs_of(tmp_path / "run")[0]["train_samples"] == 160  # 5 steps x 16 x 2 ranks
    assert torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)["world_size"] == 2


@pytest.mark.timeout(120)
def test_plain_run_without_launcher_on_synthetic_batches(packed: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, packed, max_steps=2, validate=False)
    done = imgpipe_train(config, "--set", "data.backend=synthetic")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 0 epoch(s), 2 steps" in done.stdout
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["world_size"] == 1
    # plain values only: moving or renaming an imgpipe module can never make a checkpoint unloadable
    assert {module for module, _ in pickled_globals(tmp_path / "run" / "checkpoint.pt")} <= {"torch", "torch._utils", "collections"}


def pickled_globals(checkpoint: Path) -> set[tuple[str, str]]:
    """The (module, name) pairs a torch checkpoint's pickle refers to."""
    import pickletools
    import zipfile

    with zipfile.ZipFile(checkpoint) as archive:
        pickle = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
    ops = list(pickletools.genops(pickle))
    found = {tuple(arg.split(" ", 1)) for op, arg, _ in ops if op.name == "GLOBAL"}
    found |= {(ops[i - 2][1], ops[i - 1][1]) for i, (op, _, _) in enumerate(ops) if op.name == "STACK_GLOBAL"}
    return found


@pytest.mark.timeout(60)
def test_only_rank_set_is_one_line_not_keyerror(packed: Path, tmp_path: Path) -> None:
    done = imgpipe_train(write_config(tmp_path, packed), env=quiet_env(RANK="1"))
    assert done.returncode == 1
    assert "KeyError" not in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.startswith("imgpipe: error: RANK set but WORLD_SIZE not")


def start_long_run(config: Path, new_session: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0", "--nproc", "2"]
    return subprocess.Popen(cmd, env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=new_session)


def wait_for_steps(proc: subprocess.Popen, run: Path, steps: int, timeout: float = 150) -> set[int]:
    """Wait until rank 0 logged ``steps`` steps; return every descendant seen meanwhile."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        seen.update(descendants(proc.pid))
        metrics = run / "metrics.jsonl"
        if metrics.exists() and sum('"kind": "step"' in line for line in metrics.read_text().splitlines()) >= steps:
            seen.update(descendants(proc.pid))
            return seen
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"training did not reach step {steps}: {proc.communicate()[1][-2000:]}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_one_rank_stops_everything_and_names_it(packed: Path, tmp_path: Path) -> None:
    proc = start_long_run(write_config(tmp_path, packed, workers=1, epochs=50, timeout_s=30))
    seen = wait_for_steps(proc, tmp_path / "run", 2)
    ranks = rank_processes(proc.pid)
    assert len(ranks) == 2
    assert len(seen) >= 4  # 2 ranks and their DataLoader workers
    os.kill(ranks[1], signal.SIGKILL)
    start = time.monotonic()
    _, stderr = proc.communicate(timeout=90)
    assert time.monotonic() - start < 60  # well inside the 30 s process-group timeout + grace
    assert proc.returncode != 0
    # rank 0 is stopped by the launcher, or has already failed on the dead peer's closed sockets (its
    # loader workers die with it, so no forked worker keeps them open): either way rank 1 is the cause
    assert re.search(r"imgpipe: error: rank 1 exited with code -9 \(killed by SIGKILL\)(; stopped the other ranks \(0\))?\n", stderr), (
        stderr[-3000:]
    )
    assert wait_gone(sorted(seen), 20) == []  # no orphans: ranks and loader workers are gone


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_writes_a_checkpoint_and_stops_every_process(packed: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start_long_run(write_config(tmp_path, packed, workers=1, epochs=50, validate=False))
    seen = wait_for_steps(proc, run, 3)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-3000:]
    assert "stopped by SIGTERM at step" in stderr
    state = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert state["step"] >= max(r["step"] for r in logged if r["kind"] == "step") >= 3
    assert state["step"] % STOP_CHECK_STEPS == 0  # both ranks agreed on the stop at a check step
    assert wait_gone(sorted(seen), 20) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_to_the_process_group_stops_every_rank_and_worker(packed: Path, tmp_path: Path) -> None:
    """As a terminal does: SIGINT to the launcher, both ranks and their DataLoader workers at once."""
    run = tmp_path / "run"
    proc = start_long_run(write_config(tmp_path, packed, workers=1, epochs=50, validate=False), new_session=True)
    seen = wait_for_steps(proc, run, 2)
    assert len(seen) >= 4  # 2 ranks and their loader workers
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "stopped by SIGINT at step" in stderr.strip().splitlines()[-1], stderr[-3000:]
    step = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)["step"]
    assert step >= 2 and step % STOP_CHECK_STEPS == 0
    assert wait_gone(sorted(seen), 20) == []  # no orphans


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_slurm_the_rank_waiting_for_a_hung_one_says_so_in_one_line(packed: Path, tmp_path: Path) -> None:
    """No imgpipe launcher watches SLURM tasks: the healthy rank's gloo timeout becomes one line pointing at the others."""
    from _hooks.faults import TRAIN_FAULT_ENV, hook_env

    hang = hook_env({"PYTHONPATH": os.environ.get("PYTHONPATH", "")}, **{TRAIN_FAULT_ENV.format(rank=1): "hang"})
    tasks = start_slurm_tasks(write_config(tmp_path, packed, epochs=1, timeout_s=8), 2, **hang)
    try:
        _, stderr = tasks[0].communicate(timeout=200)
    finally:
        tasks[1].kill()  # the hung rank never ends by itself
        tasks[1].communicate()
    assert tasks[0].returncode == 1
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("imgpipe: error: rank 0: ") and "another rank died, or hung for the process-group timeout (8 s" in last, last
