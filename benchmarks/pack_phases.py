"""Where one image's time goes in ``imgpipe pack`` without ``--resize`` (keep the bytes), phase by phase.

One process, the same source files: for each, the phases of the keep path as ``pack.scatter``
runs them (read the file, walk the JPEG headers, Pillow's header parse and the scan check that
``codec.keep_failure`` makes, frame the record, its crc32, the shard's sha256, the write), then
Pillow's whole decode (the check the keep path made before), and ``Scatter`` itself with one
worker over the same files (reading with its threads, checking, framing, writing into the slots,
hashing, fsync and the journal entry). Prints CPU microseconds per image, the median of
``--passes`` passes, and the wall time of ``Scatter``, whose fsync waits for the disk.

    python benchmarks/pack_phases.py            # the ImageNet-shaped tree pack_vs_im2rec.py made
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from imgpipe.format.recordio import IRHeader, format_index_line, frame_parts, pack_header
from imgpipe.image import codec
from imgpipe.image.jpeg import inspect_jpeg
from imgpipe.packing.journal import Journal
from imgpipe.packing.plan import make_plan
from imgpipe.packing.scatter import Scatter

PHASES = ("read", "JPEG header walk", "Pillow header parse", "scan check", "record framing", "crc32", "sha256", "write")


def one_pass(paths: list[Path], out: Path) -> dict[str, float]:
    """CPU seconds per image of each phase, and of ``Scatter`` (with its wall seconds) over ``paths``."""
    total = dict.fromkeys(PHASES, 0.0)
    clock = time.thread_time
    rec_hash = hashlib.sha256()
    with open(out / "phases.rec", "wb") as rec:
        for key, path in enumerate(paths):
            t0 = clock()
            with open(path, "rb") as f:
                data = f.read()
            t1 = clock()
            info = inspect_jpeg(data)
            t2 = clock()
            opened = codec._opens(data)
            t3 = clock()
            problem = codec._scan_problem(data) if codec._scan_problem is not None else codec.decode_failure(data)
            t4 = clock()
            record = pack_header(IRHeader(0, 0.0, key, 0), data)
            parts = frame_parts(record)
            t5 = clock()
            zlib.crc32(record)
            t6 = clock()
            for part in parts:
                rec_hash.update(part)
            rec_hash.update(format_index_line(key, 0).encode("ascii"))
            t7 = clock()
            for part in parts:
                rec.write(part)
            t8 = clock()
            assert info is not None and opened and problem is None, f"{path}: not a JPEG the keep path keeps"
            for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t8 - t7)):
                total[phase] += seconds
    per_image = {phase: seconds / len(paths) for phase, seconds in total.items()}
    payloads = [path.read_bytes() for path in paths]
    start = clock()
    for payload in payloads:
        codec.decode_failure(payload)
    per_image["Pillow whole decode (the old check)"] = (clock() - start) / len(paths)
    root = paths[0].parents[2]
    rel = [str(p.relative_to(root)) for p in paths]
    plan = make_plan(root, ["c"], {"train": (rel, np.zeros(len(rel), np.int32))}, options={}, shard_size=1, shard_counts={"train": 1},
                     shuffle=False, seed=0)  # fmt: skip
    pack_out = out / "scatter"
    Journal(pack_out).folder.mkdir(parents=True, exist_ok=True)
    ignore = lambda *args: None  # noqa: E731
    start, wall = time.process_time(), time.perf_counter()
    Scatter(plan, plan.shards, root, pack_out, resize=None, quality=95, node_rank=0, advance=ignore, collect=ignore).run(1)
    per_image["Scatter, one worker (all of it; threads too)"] = (time.process_time() - start) / len(paths)
    per_image["Scatter wall (fsync waits)"] = (time.perf_counter() - wall) / len(paths)
    shutil.rmtree(pack_out)
    return per_image


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench" / "imagenet-shaped-3000",
                   help="a tree with train/<class>/* (default: the one benchmarks/pack_vs_im2rec.py makes)")  # fmt: skip
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--passes", type=int, default=3)
    a = p.parse_args(argv)
    if not (a.src / "train").is_dir():
        sys.exit(f"{a.src}/train does not exist: run benchmarks/pack_vs_im2rec.py once (it makes the data), or pass --src")
    paths = sorted(path for path in (a.src / "train").rglob("*") if path.is_file())[: a.images]
    kept = [path for path in paths if codec.prepare_image(path.read_bytes()).action == "kept"]
    with tempfile.TemporaryDirectory() as out:
        passes = [one_pass(kept, Path(out)) for _ in range(a.passes)]
    checker = "libjpeg-turbo (imgpipe's extension)" if codec._scan_problem is not None else "Pillow's whole decode (no extension)"
    print(f"{len(kept)} kept JPEGs of {a.src}/train ({len(paths)} read), one thread, scan check by {checker};"
          f" CPU microseconds per image, median of {a.passes} passes")  # fmt: skip
    for phase in passes[0]:
        print(f"  {phase:38s} {statistics.median(p[phase] for p in passes) * 1e6:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
