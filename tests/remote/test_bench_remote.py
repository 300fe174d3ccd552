"""``imgpipe bench URL`` names a slow store as the bottleneck, with the latency and throughput it saw, through
the real CLI against a real S3-API server behind a proxy that adds latency to every request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from s3_server import FaultProxy

LATENCY_S = 0.1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_of_a_slow_bucket_is_remote_io_bound_and_quotes_the_store(
    fault_proxy: FaultProxy, remote_packed: str, tmp_path: Path
) -> None:
    fault_proxy.latency_s = LATENCY_S
    report = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "imgpipe", "bench", remote_packed, "--gpus", "0", "--nproc", "1", "--workers", "1", "--steps", "4",
           "--warmup", "1", "--batch-size", "8", "--image-size", "32", "--compute-ms", "10", "--json", str(report)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(report.read_text())
    verdict, io = result["verdict"], result["runs"][0]["store_io"]
    assert verdict["bound"] == "remote", verdict["message"]
    assert io["requests"] >= 4 and io["calls"] >= 4 and io["bytes"] > 0
    assert io["latency_ms"] >= 1000 * LATENCY_S  # every request waited at least the proxy's latency
    assert io["requests_per_s"] > 0 and io["mb_per_s"] > 0
    line = next(line for line in done.stdout.splitlines() if line.startswith("verdict: "))
    assert line.startswith(f"verdict: remote I/O bound: fetching records from {remote_packed} takes ")
    assert (
        f"{io['latency_ms']:.0f} ms each on average" in line
        and "cache_dir=DIR" in line
        and f"imgpipe stage {remote_packed} /local/dir" in line
    )
    assert f"remote store: {io['requests']:,} requests in " in done.stdout
