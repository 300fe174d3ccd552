"""``imgpipe stage`` from an S3-API bucket against a boto3 s3transfer copy of the same objects.

Runs a real S3-API server on this machine (``benchmarks/_s3_server.py``: moto with objects kept
in memory, ``--latency-ms`` added to every request), puts a packed folder with ImageNet-shaped
shards in it (``--shards`` shards of about ``--shard-mb`` MB: records of random bytes with the
sizes of ImageNet's JPEGs, their .idx, the labels, sources and crc32 sidecars and a manifest)
by ``imgpipe stage DIR s3://...``, then copies it back to a fresh local folder, in alternating
rounds:

* **boto3**: ``download_file`` of every object, one after the other, each with
  ``TransferConfig(max_concurrency=10)`` (s3transfer: 8 MB ranged GETs, 10 at a time);
* **imgpipe stage**: ``stage(url, dir)``, which also hashes every file, syncs it to disk and
  compares its sha256 with the manifest's.

Each copy runs in a fresh interpreter, timed from its first request to its last byte (imports
not counted; imgpipe's time includes starting its store helper process). Prints the median
seconds and MB/s of each, and their ratio (the goal: imgpipe's time <= 1.1x boto3's), with the
requests the server answered. Wall-clock figures on a shared machine: read the ratio.

``compare(url, env, work)`` runs the rounds on a bucket someone else set up (``benchmarks/remote.py``).

    python benchmarks/remote_stage.py [--shards 6] [--shard-mb 128] [--latency-ms 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "remote"))
from _measure import compile_bytecode  # noqa: E402
from open_index import build  # noqa: E402
from s3_server import S3Server  # noqa: E402  (benchmarks/ and tests/remote/ on sys.path)

BUCKET = "imgpipe-bench"
JPEG_MEAN_BYTES = 110_000  # ImageNet's train JPEGs: 1.28 M files, about 140 GB

BOTO3 = """
import json, os, sys, time
import boto3
from boto3.s3.transfer import TransferConfig
bucket, prefix, dst = sys.argv[1:4]
t0 = time.perf_counter()
s3 = boto3.client("s3")
pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
config = TransferConfig(max_concurrency=10)
for key in keys:
    s3.download_file(bucket, key, os.path.join(dst, key.rsplit("/", 1)[1]), Config=config)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "bytes": sum(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst))}))
"""

STAGE = """
import json, sys, time
from imgpipe.staging.stager import stage
url, dst, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
report = stage(url, dst, jobs=jobs)
print(json.dumps({"seconds": time.perf_counter() - t0, "bytes": report.total_bytes}))
"""


def make_dataset(folder: Path, shards: int, shard_mb: float, seed: int = 0) -> Path:
    """A packed train split of ``shards`` shards of about ``shard_mb`` MB each, records sized as ImageNet's JPEGs."""
    records = max(shards, round(shards * shard_mb * 1e6 / JPEG_MEAN_BYTES))
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(np.log(JPEG_MEAN_BYTES) - 0.18, 0.6, size=records), 2_000, 2_000_000).astype(int)
    build(folder, records, shards, payload=lambda k: rng.bytes(int(sizes[k])))
    return folder


def copy_once(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(url: str, env: dict[str, str], work: Path, *, rounds: int = 3, jobs: int | None = None, counts: Any = None) -> dict[str, Any]:
    """Alternating rounds of a boto3 s3transfer copy and of ``imgpipe stage`` of the packed folder at
    ``url`` (an ``s3://bucket/prefix``; ``env`` reaches the store) into fresh folders under ``work``.

    Returns the median seconds and MB/s of each, and ``ratio``: imgpipe's median time over boto3's.
    ``counts()`` (optional): the server's request counts, to report the requests each copy made.
    """
    from imgpipe.staging.stager import DEFAULT_JOBS

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    env = {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)}
    runs: dict[str, list[dict[str, Any]]] = {"boto3 s3transfer": [], "imgpipe stage": []}
    for r in range(rounds):
        for name in runs:
            dst = work / f"copy-{r}-{name.split()[0]}"
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir(parents=True)
            before = counts() if counts else None
            if name.startswith("boto3"):
                result = copy_once(BOTO3, [bucket, prefix, str(dst)], env)
            else:
                result = copy_once(STAGE, [url, str(dst), str(jobs or DEFAULT_JOBS)], env)
            if before is not None:
                result["requests"] = counts()["GET"] - before["GET"]
            runs[name].append(result)
            shutil.rmtree(dst, ignore_errors=True)
    out: dict[str, Any] = {"rounds": rounds}
    for name, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        out[name] = {
            "seconds": seconds,
            "mb_s": results[0]["bytes"] / seconds / 1e6,
            "bytes": results[0]["bytes"],
            "all_seconds": [r["seconds"] for r in results],
        }
        if "requests" in results[0]:
            out[name]["gets"] = statistics.median(r["requests"] for r in results)
    out["ratio"] = out["imgpipe stage"]["seconds"] / out["boto3 s3transfer"]["seconds"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--shard-mb", type=float, default=128.0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None, help="imgpipe stage --jobs (default: its own)")
    parser.add_argument("--dir", type=Path, help="keep the dataset here (default: a temporary folder)")
    args = parser.parse_args()
    compile_bytecode()

    with tempfile.TemporaryDirectory(prefix="remote_stage.") as tmp, S3Server(lifetime_s=7200, latency_s=args.latency_ms / 1000) as server:
        work = args.dir or Path(tmp)
        data = work / "packed"
        if not (data / "manifest.json").is_file():
            make_dataset(data, args.shards, args.shard_mb)
        s3 = server.client()
        s3.create_bucket(Bucket=BUCKET)
        env = {**os.environ, **server.env()}
        from imgpipe.staging.stager import stage

        os.environ.update(server.env())
        t0 = time.perf_counter()
        up = stage(data, f"s3://{BUCKET}/packed")
        print(
            f"{up.files} files, {up.total_bytes / 1e6:,.0f} MB ({args.shards} shards) uploaded by imgpipe stage "
            f"in {time.perf_counter() - t0:.1f} s; "
            f"{args.latency_ms:.0f} ms added per request; {args.rounds} alternating round(s), each copy in a fresh interpreter"
        )
        result = compare(f"s3://{BUCKET}/packed", env, work, rounds=args.rounds, jobs=args.jobs, counts=server.counts)

    print(f"\nbucket -> local folder, medians of {args.rounds} round(s):")
    for name in ("boto3 s3transfer", "imgpipe stage"):
        r = result[name]
        print(
            f"  {name:17s} {r['seconds']:6.2f} s  {r['mb_s']:6.0f} MB/s  {r.get('gets', 0):5.0f} GETs   "
            f"(each round: {', '.join(f'{s:.2f}' for s in r['all_seconds'])} s)"
        )
    print(f"  imgpipe stage / boto3: {result['ratio']:.2f}x the time (goal: <= 1.10x)")


if __name__ == "__main__":
    main()
