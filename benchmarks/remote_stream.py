"""Streaming from an S3-API bucket, no cache: time to the first batch and images/s, against the local folder.

Runs a real S3-API server on this machine (``benchmarks/_s3_server.py``: moto with objects in
memory) that adds ``--latency-ms`` to every request, as the issue's setup does, and counts them.

* **Time to the first batch** from a bucket holding an ImageNet-sized index (``--records`` tiny
  JPEG records in ``--shards`` shards, built by ``open_index.build``): in a fresh interpreter,
  ``make_torch_loader(url, ...)`` and its first batch (2 workers, batch 256 at 64 px), against the
  same from the local folder. The GETs the opening made are counted.
* **Streaming**: ImageNet-shaped pictures (``_data.make_imagenet_shaped``) packed in shards of
  ``--shard-size``; the second epoch (workers and their clients started) of uint8 224 px train
  batches of 64 with 2 persistent workers, from the local folder, from the bucket, and from the
  bucket with ``block_shuffle`` (neighbours in one batch: fewer, merged requests). Prints images/s
  and its ratio to the local folder, range GETs per record, and the requests/s the server
  sustained (moto is one Python process: a few hundred small GETs/s on 2 cores).

Medians over ``--rounds`` rounds, each round running every case in turn. Wall-clock figures on a
shared machine: read the ratios.

    python benchmarks/remote_stream.py [--records 1281167] [--shards 1000] [--images 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "remote"))
from _data import make_imagenet_shaped  # noqa: E402
from _measure import compile_bytecode  # noqa: E402
from open_index import build  # noqa: E402
from s3_server import S3Server  # noqa: E402  (benchmarks/ and tests/remote/ on sys.path)

BUCKET = "imgpipe-bench"

FIRST_BATCH = """
import json, sys, time
t0 = time.perf_counter()
from imgpipe.loaders.torch import make_torch_loader
t1 = time.perf_counter()
loader = make_torch_loader(sys.argv[1], batch_size=256, image_size=64, workers=2, device=None, normalize=False, rank=0, world_size=1)
t2 = time.perf_counter()
images, labels = next(iter(loader))
t3 = time.perf_counter()
assert images.shape == (256, 3, 64, 64)
print(json.dumps({"open_s": t2 - t1, "first_batch_s": t3 - t1, "imports_s": t1 - t0}))
loader.close()
"""

EPOCH = """
import json, sys, time
from imgpipe.loaders.torch import make_torch_loader
kwargs = json.loads(sys.argv[2])
loader = make_torch_loader(sys.argv[1], batch_size=64, image_size=224, workers=2, device=None, normalize=False, rank=0, world_size=1,
                           **kwargs)
for x, y in loader:  # the first epoch starts the workers and their clients: not streaming yet
    pass
print("warm", flush=True)
sys.stdin.readline()  # the parent reads the server's counts between the epochs
images, t0 = 0, time.perf_counter()
for x, y in loader:
    images += len(y)
print(json.dumps({"images": images, "seconds": time.perf_counter() - t0}), flush=True)
loader.close()
"""


def second_epoch(data: str, kwargs: dict, env: dict[str, str], server: S3Server) -> dict:
    """The second epoch of a fresh loader (workers and clients started), with the range GETs the server answered during it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", EPOCH, data, json.dumps(kwargs)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    if proc.stdout.readline().strip() != "warm":
        raise RuntimeError(f"the first epoch of {data} failed (exit code {proc.wait()})")
    before = server.counts()["range_GET"]  # record reads; the index is read by whole GETs
    proc.stdin.write("\n")
    proc.stdin.flush()
    result = json.loads(proc.stdout.readline())
    result["gets"] = server.counts()["range_GET"] - before
    proc.wait(timeout=60)
    return result


def run(code: str, *args: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tiny_jpeg() -> bytes:
    """A 16 x 16 gradient JPEG of a few hundred bytes: 1.28 M of them fit in the server's memory."""
    ramp = np.linspace(0, 255, 16, dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.stack(np.broadcast_arrays(ramp[None, :], ramp[:, None], ramp[None, ::-1]), axis=-1)).save(buffer, "JPEG", quality=75)
    return buffer.getvalue()


def upload(server: S3Server, folder: Path, prefix: str) -> str:
    """Every file of ``folder`` to the bucket, 16 at a time."""
    from concurrent.futures import ThreadPoolExecutor

    s3 = server.client()
    try:
        s3.create_bucket(Bucket=BUCKET)
    except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        pass
    files = [p for p in sorted(folder.iterdir()) if p.is_file()]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.name}", Body=p.read_bytes()), files))
    return f"s3://{BUCKET}/{prefix}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_281_167)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--shard-size", default="16MB")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="keep the datasets here (default: a temporary folder)")
    args = parser.parse_args()
    compile_bytecode()

    with tempfile.TemporaryDirectory(prefix="remote_stream.") as tmp, S3Server(lifetime_s=7200, latency_s=args.latency_ms / 1000) as server:
        work = args.dir or Path(tmp)
        index = work / "index"
        if not (index / "manifest.json").is_file():
            build(index, args.records, args.shards, payload=tiny_jpeg())
        images = work / "images"
        if not (images / "manifest.json").is_file():
            from imgpipe.packing.packer import pack

            tree = make_imagenet_shaped(work / "tree", args.images, classes=10, workers=2)
            pack(tree, images, shard_size=args.shard_size, workers=2, progress=False)
        t0 = time.perf_counter()
        index_url, images_url = upload(server, index, "index"), upload(server, images, "images")
        print(f"uploaded in {time.perf_counter() - t0:.0f} s; {args.latency_ms:.0f} ms added per request; {args.rounds} round(s)")

        env = {**os.environ, **server.env(), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        first: dict[str, list[dict]] = {"local": [], "bucket": []}
        streams: dict[str, list[dict]] = {}
        cases = {
            "local folder": (str(images), {}),
            "bucket": (images_url, {}),
            "bucket, block_shuffle=64": (images_url, {"block_shuffle": 64}),
        }
        for _ in range(args.rounds):
            first["local"].append(run(FIRST_BATCH, str(index), env=env))
            gets = server.counts()["GET"]
            first["bucket"].append({**run(FIRST_BATCH, index_url, env=env), "gets": server.counts()["GET"] - gets})
            for name, (data, kwargs) in cases.items():
                streams.setdefault(name, []).append(second_epoch(data, kwargs, env, server))

        print(f"\ntime to the first batch, {args.records:,} records in {args.shards} shards (fresh interpreter, 2 workers, batch 256):")
        for name, runs in first.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            opened = args.shards + 3  # the manifest, every .idx, the labels and crc32 sidecars
            extra = f", {med['gets']:.0f} GETs ({opened / med['open_s']:.0f} GETs/s at the server while opening)" if "gets" in med else ""
            print(f"  {name:8s} open {med['open_s']:6.2f} s, first batch {med['first_batch_s']:6.2f} s after the imports{extra}")
        measured = streams["local folder"][0]["images"]
        print(f"\nstreaming the second epoch, {measured} ImageNet-shaped images (uint8 224 px, batch 64, 2 persistent workers):")
        base = statistics.median(r["images"] / r["seconds"] for r in streams["local folder"])
        for name, runs in streams.items():
            rate = statistics.median(r["images"] / r["seconds"] for r in runs)
            line = f"  {name:26s} {rate:7.1f} images/s  {rate / base:5.2f}x local"
            if name != "local folder":
                per_record = statistics.median(r["gets"] / r["images"] for r in runs)
                per_s = statistics.median(r["gets"] / r["seconds"] for r in runs)
                line += f"  {per_record:5.3f} GETs/record  {per_s:6.1f} requests/s at the server"
            print(line)


if __name__ == "__main__":
    main()
