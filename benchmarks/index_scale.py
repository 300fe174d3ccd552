"""Index, sampler and loader memory at ImageNet-21k's size: 14 M records in 21,841 classes, against 1.28 M.

Builds (once per size, in ``--dir``) a packed train split of tiny records (one 292-byte JPEG,
8 x 8, behind each record's own IRHeader: label, id), in shards of ``--records-per-shard``
(2,300: a 256 MB shard of ImageNet's 110 KB JPEGs), with the .idx files, the labels, sources,
crc32 and index sidecars and a manifest, as ``imgpipe pack`` writes them. Then, each in a fresh
interpreter, after its imports:

* ``open_shards``: ``imgpipe.open_shards(DIR, "train")``: wall and CPU seconds, RSS growth;
* ``sampler``: ``rank_indices`` of epoch 0 for rank 0 of 8 (batch 256): seconds, peak RSS growth;
* ``loader``: ``make_torch_loader(DIR, batch_size=256, image_size=32, workers=--workers)`` built, its
  first batch, then 40 more; the main process's RSS and its growth from before the loader was
  built (its pages are shared with the forked workers, so its unique memory says little), and each
  worker's RSS and unique (private) memory from ``/proc/PID/smaps_rollup``, after those batches.

Goal (issue 31): ``open_shards`` <= 3 s at 14 M; the loader's main and per-worker unique memory
stated and bounded (a worker's must not grow with the record count).

    python benchmarks/index_scale.py [--records 1281167,14000000] [--classes 21841] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

PROBE = r"""
import json, sys, time
sys.path.insert(0, {bench!r})
from _measure import child_pids, memory_mb
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))
folder, records = {folder!r}, {records}
{body}
"""

OPEN = """
import imgpipe, imgpipe.format.shardset, numpy
rss0 = status("VmRSS")
t0, c0 = time.perf_counter(), time.process_time()
shards = imgpipe.open_shards(folder, "train")
seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
assert len(shards) == records
print(json.dumps({"seconds": seconds, "cpu": cpu, "rss_mb": (status("VmRSS") - rss0) / 2**20, "peak_mb": (status("VmHWM") - rss0) / 2**20}))
"""

SAMPLER = """
from imgpipe.loaders.sampler import rank_indices
rss0 = status("VmRSS")
t0 = time.perf_counter()
mine = rank_indices(records, seed=0, epoch=0, rank=0, world_size=8, batch_size=256)
seconds = time.perf_counter() - t0
assert mine.size == records // (8 * 256) * 256
print(json.dumps({"seconds": seconds, "rss_mb": (status("VmRSS") - rss0) / 2**20, "peak_mb": (status("VmHWM") - rss0) / 2**20}))
"""

LOADER = """
import torch
torch.set_num_threads(1)
from imgpipe.loaders.torch import make_torch_loader
rss0 = status("VmRSS")
t0 = time.perf_counter()
loader = make_torch_loader(folder, batch_size=256, image_size=32, workers={workers}, device=None, normalize=False, rank=0, world_size=1)
built = time.perf_counter() - t0
batches = iter(loader)
images, labels = next(batches)
first = time.perf_counter() - t0
for _ in range(40):
    images, labels = next(batches)
main_rss, _ = memory_mb(__import__("os").getpid())  # its own pages are shared with the forked workers: its growth says more
workers = [memory_mb(pid) for pid in child_pids()]
print(json.dumps({"built_s": built, "first_batch_s": first, "main_rss_mb": main_rss, "main_growth_mb": (status("VmRSS") - rss0) / 2**20,
                  "worker_rss_mb": [w[0] for w in workers], "worker_private_mb": [w[1] for w in workers]}))
loader.close()
"""


def tiny_jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    pixels = (np.arange(8 * 8 * 3).reshape(8, 8, 3) * 5 % 256).astype(np.uint8)
    Image.fromarray(pixels).save(buffer, "JPEG", quality=75, optimize=True)
    return buffer.getvalue()


def build(folder: Path, records: int, classes: int, per_shard: int) -> None:
    """Write the packed split: every record is the same JPEG behind its own IRHeader, so a shard is one numpy array."""
    from imgpipe.format.files import checksums_bytes, index_bytes, labels_bytes
    from imgpipe.format.manifest import Manifest, ShardInfo, SplitInfo, write_manifest
    from imgpipe.format.recordio import FRAME_HEADER, IR_SIZE, MAGIC

    folder.mkdir(parents=True, exist_ok=True)
    payload = tiny_jpeg()
    body = IR_SIZE + len(payload)
    stride = FRAME_HEADER.size + body + (-body % 4)
    template = np.zeros(stride, np.uint8)
    template[FRAME_HEADER.size + IR_SIZE : FRAME_HEADER.size + body] = np.frombuffer(payload, np.uint8)
    template[:8] = np.frombuffer(np.array([MAGIC, body], "<u4").tobytes(), np.uint8)
    labels = (np.arange(records, dtype=np.int64) * classes // records).astype(np.int32)
    wnids = [f"n{c:08d}" for c in range(classes)]
    shards = -(-records // per_shard)
    bounds = np.linspace(0, records, shards + 1).astype(np.int64)
    crcs = np.empty(records, np.uint32)
    offsets = np.empty(records, np.int64)
    infos = []
    for i in range(shards):
        start, stop = int(bounds[i]), int(bounds[i + 1])
        block = np.tile(template, (stop - start, 1))
        block[:, 12:16] = labels[start:stop].astype("<f4").view(np.uint8).reshape(-1, 4)
        block[:, 16:24] = np.arange(start, stop, dtype="<u8").view(np.uint8).reshape(-1, 8)
        raw = block.tobytes()
        crcs[start:stop] = [zlib.crc32(raw[k * stride + 8 : k * stride + 8 + body]) for k in range(stop - start)]
        offsets[start:stop] = np.arange(stop - start, dtype=np.int64) * stride
        name = f"train-{i:05d}-of-{shards:05d}"
        (folder / f"{name}.rec").write_bytes(raw)
        idx = "".join(f"{k}\t{o}\n" for k, o in zip(range(start, stop), offsets[start:stop].tolist())).encode()
        (folder / f"{name}.idx").write_bytes(idx)
        infos.append(ShardInfo(f"{name}.rec", f"{name}.idx", stop - start, len(raw), hashlib.sha256(raw).hexdigest(),
                               len(idx), hashlib.sha256(idx).hexdigest()))  # fmt: skip
    sources = "".join(f"{wnids[c]}.tar/{wnids[c]}_{k}.JPEG\n" for k, c in enumerate(labels.tolist())).encode()
    files = {
        "train.sources.txt": sources,
        "train.labels.npy": labels_bytes(labels),
        "train.crc32.npy": checksums_bytes(crcs),
        "train.index.npy": index_bytes(np.arange(records, dtype=np.int64), offsets),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    split = SplitInfo(shards=infos, sources="train.sources.txt", sources_sha256=sha["train.sources.txt"], labels="train.labels.npy",
                      labels_sha256=sha["train.labels.npy"], checksums="train.crc32.npy", checksums_sha256=sha["train.crc32.npy"],
                      index_sidecar="train.index.npy", index_sidecar_sha256=sha["train.index.npy"])  # fmt: skip
    options = {"benchmark": "index_scale", "records": records, "classes": classes}
    write_manifest(folder, Manifest(classes=wnids, splits={"train": split}, options=options, source="synthetic", layout="synset-tars"))


def probe(body: str, folder: Path, records: int) -> dict[str, Any]:
    code = PROBE.format(bench=str(ROOT / "benchmarks"), folder=str(folder), records=records, body=body)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise SystemExit(f"a probe failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", default="1281167,14000000", help="comma-separated record counts")
    p.add_argument("--classes", type=int, default=21841)
    p.add_argument("--records-per-shard", type=int, default=2300)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=3, help="runs of each probe; medians shown")
    p.add_argument("--dir", type=Path, help="keep the datasets here (default: a temporary folder)")
    a = p.parse_args(argv)
    from _measure import compile_bytecode

    compile_bytecode()
    sizes = [int(n) for n in a.records.split(",")]
    with tempfile.TemporaryDirectory(prefix="index_scale.") as tmp:
        base = a.dir or Path(tmp)
        rows = {}
        for records in sizes:
            folder = base / f"train-{records}-{a.classes}"
            if not (folder / "manifest.json").is_file():
                t0 = time.perf_counter()
                build(folder, records, a.classes, a.records_per_shard)
                print(
                    f"built {records:,} records in {-(-records // a.records_per_shard):,} shards in {time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
            runs = {name: [] for name in ("open", "sampler", "loader")}
            for _ in range(a.runs):
                for name, body in (("open", OPEN), ("sampler", SAMPLER), ("loader", LOADER.replace("{workers}", str(a.workers)))):
                    runs[name].append(probe(body, folder, records))
            rows[records] = {name: {k: _median([r[k] for r in rs]) for k in rs[0]} for name, rs in runs.items()}
            print(f"{records:,}: {json.dumps(rows[records])}", flush=True)
    print(f"\n{a.classes:,} classes, {a.records_per_shard:,} records per shard, {a.workers} loader workers; medians of {a.runs} runs\n")
    print("| records | open_shards s (CPU s) | open RSS +MB | rank_indices s, peak +MB | first batch s | main RSS / +MB for the loader | "
          "per-worker RSS / unique MB |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for records, r in rows.items():
        o, s, lo = r["open"], r["sampler"], r["loader"]
        workers = ", ".join(f"{rss:.0f} / {private:.0f}" for rss, private in zip(lo["worker_rss_mb"], lo["worker_private_mb"]))
        print(f"| {records:,} | {o['seconds']:.2f} ({o['cpu']:.2f}) | {o['rss_mb']:.0f} | {s['seconds']:.2f}, {s['peak_mb']:.0f} | "
              f"{lo['first_batch_s']:.2f} | {lo['main_rss_mb']:.0f} / {lo['main_growth_mb']:.0f} | {workers} |")  # fmt: skip
    if len(rows) >= 2:
        (small, lo_r), (big, hi_r) = list(rows.items())[0], list(rows.items())[-1]
        per = lambda key: (hi_r["loader"][key] - lo_r["loader"][key]) * 2**20 / (big - small)  # noqa: E731
        worker_growth = max(hi_r["loader"]["worker_private_mb"]) - max(lo_r["loader"]["worker_private_mb"])
        print(
            f"\nthe loader's main process: {per('main_growth_mb'):.1f} bytes more per record; "
            f"largest worker's unique memory: {worker_growth:+.0f} MB from {small:,} to {big:,} records"
        )
        top = hi_r["open"]["seconds"]
        print(f"open_shards at {big:,} records: {top:.2f} s (goal <= 3 s): {'met' if top <= 3 else 'MISSED'}")
    return 0


def _median(values: list[Any]) -> Any:
    if isinstance(values[0], list):
        return [float(np.median(column)) for column in zip(*values)]
    return float(np.median(values))


if __name__ == "__main__":
    sys.exit(main())
