"""How long, and how much memory, opening a 1.28 M-record dataset takes: imgpipe vs MXNet.

Builds an ImageNet-sized index from tiny records (8-byte payloads) as N shards with the
labels, sources, crc32 and index sidecars and a manifest, then, each time in a fresh interpreter:

* ``imgpipe.open_shards(DIR)``: manifest, the index sidecar, the labels sidecar (what a loader does);
* ``recordio.read_index`` of every .idx alone;
* MXNet's ``MXIndexedRecordIO(idx, rec, "r")`` for every shard (it parses the .idx into a dict),
  when the reference venv is given (``--mxnet-python`` or ``IMGPIPE_MXNET_PYTHON``).

Each is timed after its imports (wall and CPU seconds: on a busy machine CPU time is the
better guide), with the tracemalloc peak and the RSS growth (VmRSS and VmHWM
from /proc/self/status) of the open alone. Medians over ``--runs`` runs; the page cache is warm.

    python benchmarks/open_index.py [--records 1281167] [--shards 4] [--runs 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from imgpipe.format import recordio
from imgpipe.format.files import index_bytes
from imgpipe.format.manifest import Manifest, ShardInfo, SplitInfo, write_manifest

PROBE = r"""
import json, sys, time, tracemalloc
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))
{imports}
def open_it():
{body}
rss0 = status("VmRSS")
t0, c0 = time.perf_counter(), time.process_time()
kept = open_it()
seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
rss1, hwm = status("VmRSS"), status("VmHWM")
del kept
tracemalloc.start()
kept = open_it()
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
print(json.dumps({{"seconds": seconds, "cpu_seconds": cpu, "rss_delta": rss1 - rss0, "hwm_delta": hwm - rss0, "tracemalloc_peak": peak}}))
"""

CASES = {
    "imgpipe.open_shards": (
        "import imgpipe, imgpipe.format.shardset, numpy",
        "    s = imgpipe.open_shards({dir!r}, 'train')\n    assert len(s) == {records} and s.labels.size == {records}\n    return s",
    ),
    "recordio.read_index": (
        "from imgpipe.format import recordio",
        "    out = [recordio.read_index(p) for p in {idxs!r}]\n    assert sum(k.size for k, _ in out) == {records}\n    return out",
    ),
    "mxnet MXIndexedRecordIO": (
        "import mxnet",
        "    out = [mxnet.recordio.MXIndexedRecordIO(i, r, 'r') for i, r in zip({idxs!r}, {recs!r})]\n"
        "    assert sum(len(o.keys) for o in out) == {records}\n    return out",
    ),
}


def build(folder: Path, records: int, shards: int, classes: int = 1000, payload: bytes | Callable[[int], bytes] | None = None) -> None:
    """Write ``records`` tiny records as ``shards`` shards of split train, with sidecars and manifest.

    Record k's payload is k as 8 bytes, or ``payload`` (e.g. a tiny JPEG, so that loaders decode it),
    or ``payload(k)``.
    """
    from imgpipe._sys.checksum import sha256_file  # here: benchmarks/remote.py --baseline imports this module with an older imgpipe

    folder.mkdir(parents=True, exist_ok=True)
    labels = (np.arange(records, dtype=np.int64) * classes // records).astype(np.int32)
    wnids = [f"n{c:08d}" for c in range(classes)]
    bounds = np.linspace(0, records, shards + 1).astype(int)
    infos = []
    crcs = np.empty(records, dtype=np.uint32)
    for i in range(shards):
        name = f"train-{i:05d}-of-{shards:05d}"
        rec, idx = folder / f"{name}.rec", folder / f"{name}.idx"
        with recordio.IndexedRecordWriter(rec, idx) as writer:
            for k in range(bounds[i], bounds[i + 1]):
                header = recordio.IRHeader(0, float(labels[k]), k, 0)
                data = k.to_bytes(8, "little") if payload is None else payload(k) if callable(payload) else payload
                record = recordio.pack_header(header, data)
                crcs[k] = zlib.crc32(record)
                writer.write(k, record)
        infos.append(
            ShardInfo(
                name=rec.name,
                index=idx.name,
                records=int(bounds[i + 1] - bounds[i]),
                bytes=rec.stat().st_size,
                sha256=sha256_file(rec),
                index_bytes=idx.stat().st_size,
                index_sha256=sha256_file(idx),
            )
        )
    sources = "".join(f"train/{wnids[c]}/{wnids[c]}_{k}.JPEG\n" for k, c in enumerate(labels.tolist())).encode()
    (folder / "train.sources.txt").write_bytes(sources)
    np.save(folder / "train.labels.npy", labels, allow_pickle=False)
    np.save(folder / "train.crc32.npy", crcs, allow_pickle=False)
    indexes = [recordio.read_index(folder / info.index) for info in infos]
    (folder / "train.index.npy").write_bytes(index_bytes(np.concatenate([k for k, _ in indexes]), np.concatenate([o for _, o in indexes])))
    split = SplitInfo(
        shards=infos,
        sources="train.sources.txt",
        sources_sha256=hashlib.sha256(sources).hexdigest(),
        labels="train.labels.npy",
        labels_sha256=sha256_file(folder / "train.labels.npy"),
        checksums="train.crc32.npy",
        checksums_sha256=sha256_file(folder / "train.crc32.npy"),
        index_sidecar="train.index.npy",
        index_sidecar_sha256=sha256_file(folder / "train.index.npy"),
    )
    options = {"benchmark": "open_index", "records": records, "shards": shards}
    write_manifest(folder, Manifest(classes=wnids, splits={"train": split}, options=options, source="synthetic"))


def probe(python: str, case: str, folder: Path, records: int) -> dict:
    imports, body = CASES[case]
    recs = sorted(str(p) for p in folder.glob("train-*.rec"))
    idxs = [r[: -len(".rec")] + ".idx" for r in recs]
    code = PROBE.format(imports=imports, body=body.format(dir=str(folder), idxs=idxs, recs=recs, records=records))
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_281_167)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="reuse or create the dataset here (default: a temporary folder)")
    parser.add_argument("--mxnet-python", default=os.environ.get("IMGPIPE_MXNET_PYTHON"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="open_index.") as tmp:
        folder = args.dir or Path(tmp) / "data"
        if not (folder / "manifest.json").is_file():
            t0 = time.perf_counter()
            build(folder, args.records, args.shards)
            print(f"built {args.records} records in {args.shards} shards in {time.perf_counter() - t0:.1f} s: {folder}")
        idx_mb = sum(p.stat().st_size for p in folder.glob("*.idx")) / 1e6
        print(f".idx text: {idx_mb:.1f} MB; {args.runs} runs each, fresh interpreter, warm page cache\n")
        cases = [(c, sys.executable) for c in CASES if not c.startswith("mxnet")]
        if args.mxnet_python and os.access(args.mxnet_python, os.X_OK):
            cases.append(("mxnet MXIndexedRecordIO", args.mxnet_python))
        else:
            print("(no MXNet baseline: pass --mxnet-python or set IMGPIPE_MXNET_PYTHON)")
        medians = {}
        print(f"{'case':26s} {'open s':>8s} {'CPU s':>6s} {'tracemalloc MB':>15s} {'RSS +MB':>8s} {'peak RSS +MB':>13s}")
        for case, python in cases:
            runs = [probe(python, case, folder, args.records) for _ in range(args.runs)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            medians[case] = med
            print(
                f"{case:26s} {med['seconds']:8.3f} {med['cpu_seconds']:6.3f} {med['tracemalloc_peak'] / 1e6:15.1f} "
                f"{med['rss_delta'] / 1e6:8.1f} {med['hwm_delta'] / 1e6:13.1f}"
            )
        ours = medians["imgpipe.open_shards"]
        peak_mb = max(ours["tracemalloc_peak"], ours["hwm_delta"]) / 1e6
        print(
            f"\ngoal (open under 1 s, under 100 MB): {ours['seconds']:.3f} s, {peak_mb:.1f} MB peak: "
            f"{'met' if ours['seconds'] < 1 and peak_mb < 100 else 'MISSED'}"
        )
        if "mxnet MXIndexedRecordIO" in medians:
            ours, theirs = medians["imgpipe.open_shards"], medians["mxnet MXIndexedRecordIO"]
            print(
                f"imgpipe.open_shards vs MXNet: {theirs['seconds'] / ours['seconds']:.1f}x faster, "
                f"{theirs['rss_delta'] / max(ours['rss_delta'], 1):.1f}x less RSS growth"
            )


if __name__ == "__main__":
    main()
