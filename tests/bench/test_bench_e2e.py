"""imgpipe bench for real: spawned gloo ranks, real shards, real DataLoader workers, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hooks.faults import READ_DELAY_ENV, hook_env
from bench_helpers import SCHEMA, check
from PIL import Image

from imgpipe._sys.diskinfo import device_for_path
from imgpipe.bench import BenchConfig, bench
from imgpipe.errors import ConfigError


def imgpipe(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "imgpipe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=hook_env(dict(os.environ), **(env or {})),
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_names_the_rank_slowed_on_purpose_with_an_io_cause(packed_dir: Path, tmp_path: Path) -> None:
    """Rank 1 reads through the documented delay hook (60 ms a record): the bench must find it."""
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = imgpipe(
        "bench",
        str(packed_dir),
        "--gpus",
        "0",
        "--nproc",
        "2",
        "--workers",
        "1,2",
        "--steps",
        "10",
        "--warmup",
        "2",
        "--batch-size",
        "4",
        "--image-size",
        "64",
        "--compute-ms",
        "50",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
        env={READ_DELAY_ENV.format(rank=1): "60"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verdict: rank 1 is a straggler" in proc.stdout and "I/O cause" in proc.stdout, proc.stdout
    document = json.loads(out_json.read_text())
    check(document, SCHEMA)
    assert [(r["backend"], r["workers"]) for r in document["runs"]] == [("torch", 1), ("torch", 2)]
    verdict = document["verdict"]
    assert (verdict["bound"], verdict["straggler"], verdict["cause"]) == ("straggler", 1, "I/O")
    judged = next(r for r in document["runs"] if r["workers"] == verdict["workers"])
    rank0, rank1 = judged["ranks"]
    assert rank1["data_wait_frac"] > rank0["data_wait_frac"] + 0.15
    assert rank1["stages_ms"]["read"] >= 4 * 60 * 0.9  # 4 records a batch, 60 ms each
    assert rank0["stages_ms"]["read"] < 60
    assert rank0["stages_ms"]["sync"] > rank1["stages_ms"]["sync"]  # rank 0 waits for rank 1 in the all-reduce
    assert all(r["steps"] == 10 and r["images"] == 40 for r in judged["ranks"])
    assert judged["imbalance"] < 0.8
    with Image.open(out_png) as png:
        assert png.format == "PNG"


@pytest.mark.timeout(180)
def test_large_images_one_worker_no_compute_is_decode_bound(large_pack: Path) -> None:
    config = BenchConfig(data=str(large_pack), workers=(0,), steps=4, warmup=1, batch_size=2, image_size=224)
    result, verdict = bench(config)
    assert verdict.bound == "decode", verdict.message
    assert "--backend dali" in verdict.message and "--resize 256" in verdict.message
    rank = result.runs[0].ranks[0]
    phases = rank.phase_ms()
    assert phases["decode"] > 5 * phases["read"]
    # no compute: the step is the loader's, waited for or its own work on the batch (normalizing it)
    assert sum(s.wait + s.collate for s in rank.steps) > 0.9 * sum(s.total for s in rank.steps)


@pytest.mark.timeout(120)
def test_cold_evicts_the_shards_before_the_run(packed_dir: Path) -> None:
    fstype = device_for_path(packed_dir).fstype
    if fstype in ("tmpfs", "ramfs", "overlay"):
        pytest.skip(f"{packed_dir} is on {fstype}: its pages cannot be evicted")
    for shard in packed_dir.glob("*.rec"):
        shard.read_bytes()  # now they are in the page cache
    warm, _ = bench(BenchConfig(data=str(packed_dir), workers=(0,), steps=2, warmup=0, batch_size=4, image_size=32))
    if warm.runs[0].resident_before is None:
        pytest.skip("mincore is not available here")
    assert warm.runs[0].resident_before > 0.9
    cold, verdict = bench(BenchConfig(data=str(packed_dir), workers=(0,), steps=2, warmup=0, batch_size=4, image_size=32, cold=True))
    assert cold.runs[0].resident_before < 0.1
    assert not any("--cold" in note for note in verdict.notes)


@pytest.mark.timeout(180)
def test_model_compute_is_measured(packed_dir: Path) -> None:
    config = BenchConfig(data=str(packed_dir), workers=(0,), steps=2, warmup=1, batch_size=2, image_size=32, model="resnet18")
    result, verdict = bench(config)
    phases = result.runs[0].ranks[0].phase_ms()
    assert phases["compute"] > 0.5 and phases["sync"] < phases["compute"]
    assert verdict.bound in ("compute", "decode", "io")
    with pytest.raises(ConfigError, match="not a torchvision classification model"):
        bench(BenchConfig(data=str(packed_dir), workers=(0,), steps=1, warmup=0, batch_size=2, image_size=32, model="resnet_nope"))


def test_bad_options_are_one_line_config_errors(packed_dir: Path) -> None:
    with pytest.raises(ConfigError, match="--model NAME or --compute-ms T, not both"):
        BenchConfig(data=str(packed_dir), model="resnet18", compute_ms=5).check()
    with pytest.raises(ConfigError, match="--workers"):
        BenchConfig(data=str(packed_dir), workers=(-1,)).check()
    with pytest.raises(ConfigError, match="one rank per GPU"):
        BenchConfig(data=str(packed_dir), gpus=2, nproc=3).check()
    with pytest.raises(ConfigError, match="--backend must be torch, dali or all"):
        BenchConfig(data=str(packed_dir), backends=("mxnet",)).check()
    # each message names the option that is wrong, and only that one
    for options, message in (
        ({"warmup": -1}, "--warmup must be >= 0 (got -1)"),
        ({"steps": 0}, "--steps must be >= 1 (got 0)"),
        ({"batch_size": 0}, "--batch-size must be >= 1 (got 0)"),
        ({"image_size": 4}, "--image-size must be >= 8 (got 4)"),
        ({"nproc": 0}, "--nproc must be >= 1 (got 0)"),
        ({"gpus": -1}, "--gpus must be >= 0 (got -1)"),
        ({"model": "resnet5"}, "--model 'resnet5' is not a torchvision classification model; did you mean resnet50"),
    ):
        with pytest.raises(ConfigError) as error:
            BenchConfig(data=str(packed_dir), **options).check()
        assert str(error.value).startswith(message), str(error.value)
    with pytest.raises(ConfigError, match="48 records, not one batch of 32 for each of 2 rank"):
        bench(BenchConfig(data=str(packed_dir), nproc=2, batch_size=32))


@pytest.mark.timeout(120)
def test_cli_errors_are_one_line(packed_dir: Path, tmp_path: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        proc = imgpipe("bench", str(packed_dir), "--gpus", "2")
        assert proc.returncode != 0
        assert "imgpipe: error: --gpus 2 needs CUDA" in proc.stderr and "--gpus 0 --nproc 2" in proc.stderr
        assert "Traceback" not in proc.stderr
    proc = imgpipe("bench", str(tmp_path), "--gpus", "0", "--workers", "1,x")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "imgpipe: error: --workers takes counts" in proc.stderr
    proc = imgpipe("bench", str(packed_dir), "--gpus", "0", "--set", "train.amp=fp8")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("imgpipe: error: --set train.amp=fp8") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.timeout(200)
def test_unwritable_json_and_plot_paths_fail_before_measuring(packed_dir: Path, tmp_path: Path) -> None:
    """Every record read would take an hour (the delay hook): only a check before measuring can answer in time."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    slow = {READ_DELAY_ENV.format(rank=0): "3600000"}
    cases = [
        ("--json", tmp_path / "missing" / "bench.json", "folder " + str(tmp_path / "missing") + " does not exist"),
        ("--json", a_file / "bench.json", f"{a_file} is a file, not a folder"),
        ("--plot", tmp_path / "missing" / "bench.png", "does not exist"),
        ("--plot", a_file / "bench.png", "is a file, not a folder"),
    ]
    for option, path, words in cases:
        proc = imgpipe("bench", str(packed_dir), "--gpus", "0", "--steps", "2", "--warmup", "0", option, str(path), env=slow, timeout=40)
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert proc.stderr.startswith(f"imgpipe: error: {option} {path}: ") and words in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""


@pytest.mark.dali
@pytest.mark.timeout(180)
def test_dali_backend_runs_and_its_internal_phases_are_unknown(packed_dir: Path) -> None:
    from imgpipe.loaders.dali import dali_available

    if not dali_available():
        pytest.skip("nvidia.dali is not importable (pip install 'imgpipe[dali]')")
    config = BenchConfig(
        data=str(packed_dir), backends=("dali",), workers=(1,), steps=3, warmup=1, batch_size=4, image_size=32, compute_ms=5
    )
    result, verdict = bench(config)
    rank = result.runs[0].ranks[0]
    phases = rank.phase_ms()
    assert phases["read"] is None and phases["decode"] is None
    assert phases["compute"] >= 5.0 and rank.summary().images == 12
    assert verdict.backend == "dali" and "--backend dali" not in verdict.message


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ranks_whose_workers_are_stuck_get_their_grace_and_leave_nothing_behind(packed_dir: Path, tmp_path: Path) -> None:
    """bench --nproc 2, every loader worker stopped (a read on a hung mount), one SIGTERM: the command, not told the
    ranks' grace, ended itself 5 s later, the ranks (whose loaders wait 5 s on a stuck worker as they stop) killed
    before they could say so and the launcher's folder of the run left in the temporary folder."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    from proctree import descendants, stopped, wait_gone

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = hook_env(dict(os.environ), IMGPIPE_TEST_STUCK_READS="1", TMPDIR=str(temporary), OMP_NUM_THREADS="1")
    args = ["bench", str(packed_dir), "--gpus", "0", "--nproc", "2", "--workers", "1", "--batch-size", "4", "--image-size", "32"]
    proc = subprocess.Popen([sys.executable, "-m", "imgpipe", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while sum(stopped(pid) for pid in descendants(proc.pid)) < 2:  # both ranks' workers are stuck
            assert proc.poll() is None and time.monotonic() < deadline, "the loader workers did not get stuck"
            time.sleep(0.05)
        seen = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last == "imgpipe: stopped by SIGTERM: stopped every rank", last  # each rank unwound, its worker killed, in ~5 s
    assert wait_gone(seen, 10) == []
    assert list(temporary.glob("imgpipe-ranks-*")) == []
