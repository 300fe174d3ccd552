"""The trainer's ``data.stage``: the bucket copied once per node before training, then read from the node's folder.

Real launchers on one machine: two torchrun node agents (c10d rendezvous, gloo), each node with its
own folder; ranks started as ``srun`` starts them; ``--nproc``. A proxy in front of the S3 server
counts the shard requests: one copy per node, and training reads nothing more from the bucket.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest
from remote_env import BUCKET
from s3_server import FaultProxy, S3Server

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from proctree import quiet_env, torchrun_logs  # noqa: E402
from train_cli import free_port, one_line_error, write_config  # noqa: E402

from imgpipe.format.shardset import open_shardset  # noqa: E402

TORCHRUN = Path(sys.executable).parent / "torchrun"


def shard_count(folder: Path) -> int:
    return sum(1 for p in folder.iterdir() if p.suffix == ".rec")


def assert_staged(packed: Path, folder: Path) -> None:
    names = sorted(p.name for p in packed.iterdir() if p.is_file())
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == names
    assert filecmp.cmpfiles(packed, folder, names, shallow=False)[1:] == ([], [])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_data_stage_under_two_torchrun_nodes_each_with_its_own_folder(
    fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, packed_dir, epochs=1, batch_size=4, validate=False)
    port = free_port()
    agents = []
    for node in range(2):
        cmd = [str(TORCHRUN), *torchrun_logs(tmp_path),
               "--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
               "--rdzv_id", "imgpipe-stage", "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0",
               "--set", f"data.path={remote_packed}", "--set", f"data.stage={tmp_path / f'node{node}' / 'imagenet'}"]  # fmt: skip
        agents.append(subprocess.Popen(cmd, env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [agent.communicate(timeout=560) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(err[-3000:] for _, err in outs)
    assert "".join(out for out, _ in outs).count("done: 1 epoch(s), 3 steps") == 1  # 48 records / G 16
    for node in range(2):
        assert_staged(packed_dir, tmp_path / f"node{node}" / "imagenet")
    stderr = "".join(err for _, err in outs)
    assert stderr.count(": staged from s3://") == 2  # local rank 0 of each node
    assert fault_proxy.counts.matching_gets == 2 * shard_count(packed_dir)  # one copy per node; training read the nodes' folders


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_data_stage_with_local_ranks_started_here(fault_proxy: FaultProxy, remote_packed: str, packed_dir: Path, tmp_path: Path) -> None:
    """``--nproc 2``: the launcher stages before it starts the ranks; a rerun finds the copy in place."""
    config = write_config(tmp_path, packed_dir, max_steps=1, batch_size=4, validate=False)
    staged = tmp_path / "local" / "imagenet"
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0", "--nproc", "2",
           "--set", f"data.path={remote_packed}", "--set", f"data.stage={staged}"]  # fmt: skip
    done = subprocess.run(cmd, env=quiet_env(), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_staged(packed_dir, staged)
    assert fault_proxy.counts.matching_gets == shard_count(packed_dir)
    again = subprocess.run([*cmd, "--overwrite"], env=quiet_env(), capture_output=True, text=True, timeout=280)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already there, nothing copied" in again.stderr
    assert fault_proxy.counts.matching_gets == shard_count(packed_dir)


@pytest.mark.timeout(300)
def test_when_local_rank_0_cannot_stage_every_rank_says_why_in_one_line(s3_env: S3Server, packed_dir: Path, tmp_path: Path) -> None:
    """Two ranks started as ``srun --ntasks 2`` starts them on one node: rank 0 meets a damaged shard; rank 1, waiting
    for its copy, fails with rank 0's reason instead of waiting on."""
    url = s3_env.upload(packed_dir, BUCKET, "damaged-for-train")
    shard = open_shardset(packed_dir).rec_names[0]
    data = bytearray((packed_dir / shard).read_bytes())
    data[100] ^= 0x01
    s3_env.put(BUCKET, f"damaged-for-train/{shard}", bytes(data))
    config = write_config(tmp_path, packed_dir, max_steps=1, batch_size=4, validate=False)
    slurm = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_ID": "4243",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    cmd = [sys.executable, "-m", "imgpipe", "train", "--config", str(config), "--gpus", "0",
           "--set", f"data.path={url}", "--set", f"data.stage={tmp_path / 'local'}"]  # fmt: skip
    tasks = [
        subprocess.Popen(
            cmd,
            env=quiet_env(**slurm, SLURM_PROCID=str(t), SLURM_LOCALID=str(t)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for t in range(2)
    ]
    results = [subprocess.CompletedProcess(cmd, task.wait(timeout=240), *task.communicate()) for task in tasks]
    reason = f"{url}/{shard}: sha256 differs from the manifest, twice alike"
    one_line_error(results[0], reason)
    one_line_error(results[1], f"{tmp_path / 'local'}: local rank 0 could not stage {url} there: {reason}")
