"""The peers' rows of the remote-storage benchmark: Mosaic Streaming and LitData reading train
batches from a local S3-API server with 20 ms added per request, against imgpipe's torch loader
reading the same JPEGs from a local packed folder, in the same run.

The peers run in a venv of their own (``bash benchmarks/peers_env.sh VENV``), each loader in a
fresh process of its own (``_peer_child.py``; imgpipe through ``loaders.py``'s child) with an empty
cache: the first epoch is cold, the second reads what the first cached. The server
(``_s3_server.py``: moto, objects in memory, the latency, request counts) runs in a process of
its own on the same cores, so it costs what it costs here (about 3 ms of CPU per request). Rounds
alternate their order; figures are medians over rounds, ratios are taken within a round.

The peers' shards are 16 MB by default, so that each worker reads many, as it would from a real
dataset's thousands; with a few 64 MB shards over 2 workers, LitData 0.2.76 shares chunks between
its workers and reads a shared chunk's whole file for every item window (3-4x slower here).

    bash benchmarks/peers_env.sh /tmp/peers-venv
    python benchmarks/remote_peers.py --peers-python /tmp/peers-venv/bin/python            # 3,000 ImageNet-shaped JPEGs
    python benchmarks/remote_peers.py --peers-python /tmp/peers-venv/bin/python --quick    # 600 JPEGs, 1 round

``prepare_peer`` (shards made once, uploaded) and ``run_peer`` (one process's epochs) are the
pieces a benchmark of imgpipe's own remote reads calls for these rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import _s3_server  # benchmarks/ is on sys.path when run as a script
from _data import describe_tree
from _measure import compile_bytecode
from loaders import in_own_process, prepare, run_script

PEER_CHILD = Path(__file__).with_name("_peer_child.py")
PEERS = ("mosaic", "litdata")
BASELINE = "imgpipe-local"  # imgpipe's torch loader, uint8, from the packed folder on local disk
BUCKET = "imgpipe-bench"


def prepare_peer(peers_python: Path, peer: str, train: Path, work: Path, endpoint: str, *, shard_mb: int, seed: int = 0) -> dict[str, Any]:
    """The peer's shards of ``train`` (made once under ``work``) uploaded to ``s3://BUCKET/<shards' name>``
    on the server at ``endpoint``; returns the child's JSON plus ``url``."""
    name = f"{peer}-{train.parent.name}-{shard_mb}mb"
    spec = {"peer": peer, "train": str(train), "shards": str(work / name), "shard_mb": shard_mb, "seed": seed,
            "url": f"s3://{BUCKET}/{name}", "endpoint": endpoint}  # fmt: skip
    out = run_script([str(peers_python), str(PEER_CHILD), "write", json.dumps(spec)], f"{peer}'s writer")
    return {**json.loads(out.strip().splitlines()[-1]), "url": spec["url"]}


def run_peer(peers_python: Path, peer: str, url: str, endpoint: str, cache_dir: Path, *, batch_size: int, image_size: int, workers: int,
             epochs: int, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """One process of the peer's epochs from ``url``, its cache in ``cache_dir`` (emptied before, removed after)."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    spec = {"peer": peer, "url": url, "endpoint": endpoint, "cache_dir": str(cache_dir), "batch_size": batch_size, "image_size": image_size,
            "workers": workers, "epochs": epochs, "seed": seed}  # fmt: skip
    try:
        out = run_script([str(peers_python), str(PEER_CHILD), "run", json.dumps(spec)], f"{peer} ({workers} workers)")
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return json.loads(out.strip().splitlines()[-1])


def epoch_figures(result: dict[str, Any]) -> list[dict[str, float]]:
    """Per epoch: images/s (and per CPU-second of the loader's processes), and what the server
    answered during it (GETs, MB, requests per second)."""
    figures = []
    for epoch in result["epochs"]:
        counted = epoch.get("counters", {})
        figures.append({
            "images_per_s": epoch["images"] / epoch["wall_s"], "images_per_cpu_s": epoch["images"] / max(epoch["cpu_s"], 1e-9),
            "GET": counted.get("GET", 0), "range_GET": counted.get("range_GET", 0),
            "requests": counted.get("requests", 0), "MB": counted.get("bytes_out", 0) / 1e6,
            "requests_per_s": counted.get("requests", 0) / epoch["wall_s"], "cache_MB": counted.get("cache_bytes", 0) / 1e6,
        })  # fmt: skip
    return figures


def report(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Print the per-loader table and the ratios against imgpipe from a local folder; return the figures."""
    figures: dict[str, Any] = {}
    print(
        f"\n{'loader':14s} {'cold img/s':>10s} {'warm img/s':>10s} {'/CPU-s cold/warm':>16s}  {'GETs cold/warm':>14s} "
        f"{'MB cold/warm':>13s} {'req/s cold':>10s} {'cache MB':>8s}"
    )
    for name, results in runs.items():
        per_round = [epoch_figures(r) for r in results]
        cold = statistics.median(f[0]["images_per_s"] for f in per_round)
        warm = statistics.median(statistics.median(e["images_per_s"] for e in f[1:]) for f in per_round)
        last = per_round[-1]
        gets = f"{last[0]['GET']}/{sum(e['GET'] for e in last[1:])}"
        mb = f"{last[0]['MB']:.0f}/{sum(e['MB'] for e in last[1:]):.0f}"
        rate = statistics.median(f[0]["requests_per_s"] for f in per_round)
        per_cpu = "/".join(f"{statistics.median(f[k]['images_per_cpu_s'] for f in per_round):.0f}" for k in (0, -1))
        print(f"{name:14s} {cold:10.0f} {warm:10.0f} {per_cpu:>16s}  {gets:>14s} {mb:>13s} {rate:10.1f} {last[0]['cache_MB']:8.0f}")
        figures[name] = {"cold": cold, "warm": warm, "requests_per_s_cold": rate, "rounds": per_round}
    if BASELINE in runs:
        print(f"\nratios to {BASELINE} (median over rounds of the ratio within each round)")
        base = [epoch_figures(r) for r in runs[BASELINE]]
        for name in runs:
            if name == BASELINE:
                continue
            rounds = [epoch_figures(r) for r in runs[name]]
            cold = statistics.median(p[0]["images_per_s"] / b[0]["images_per_s"] for p, b in zip(rounds, base))
            warm = statistics.median(p[-1]["images_per_s"] / b[-1]["images_per_s"] for p, b in zip(rounds, base))
            print(f"  {name:10s} cold {cold:4.2f}x  warm {warm:4.2f}x")
            figures[f"ratio {name}/{BASELINE}"] = {"cold": cold, "warm": warm}
    return figures


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers-python", type=Path, required=True, help="the interpreter of the peers' venv (benchmarks/peers_env.sh)")
    p.add_argument("--images", type=int, default=3000, help="ImageNet-shaped train JPEGs")
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="600 images, 1 round")
    p.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "imgpipe-bench-loaders",
        help="data folder (reused between runs; shared with loaders.py)",
    )
    p.add_argument("--only", default=",".join((*PEERS, BASELINE)), help=f"comma-separated subset of {', '.join((*PEERS, BASELINE))}")
    p.add_argument(
        "--shard-mb",
        type=int,
        default=16,
        help="the peers' shard size: 24 shards of the 3,000 JPEGs, 12 per worker (their libraries' default, 64 MB, makes 6)",
    )
    p.add_argument("--latency-ms", type=float, default=20.0, help="added by the server before every request")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--epochs", type=int, default=2, help="per process: the cold first epoch, then warm ones")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args(argv)
    if a.quick:
        a.images, a.classes, a.rounds = 600, 10, 1
    if not a.peers_python.is_file():
        p.error(f"--peers-python {a.peers_python}: no such interpreter (bash benchmarks/peers_env.sh VENV builds one)")
    a.names = [n.strip() for n in a.only.split(",") if n.strip()]
    if set(a.names) - {*PEERS, BASELINE}:
        p.error(f"unknown loader(s): {', '.join(sorted(set(a.names) - {*PEERS, BASELINE}))}")
    a.epochs, a.rounds = max(2, a.epochs), max(1, a.rounds)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    compile_bytecode()
    a.data, a.prepare_workers = "imagenet", len(os.sched_getaffinity(0))
    src, rec = prepare(a)
    train = src / "train"
    print(f"data: {a.images} train JPEGs ({describe_tree(train)}); batch {a.batch_size}, size {a.image_size} uint8, {a.workers} workers; "
          f"{a.epochs} epochs per process (the first cold), medians of {a.rounds} rounds; "
          f"server latency {a.latency_ms:.0f} ms per request")  # fmt: skip
    with _s3_server.start(latency_s=a.latency_ms / 1e3) as server:
        urls = {}
        for peer in (n for n in a.names if n in PEERS):
            written = prepare_peer(a.peers_python, peer, train, a.work, server.url, shard_mb=a.shard_mb)
            urls[peer] = written["url"]
            print(
                f"{peer}: {written['files']} files, {written['bytes'] / 1e6:.0f} MB in {written['url']} "
                f"(uploaded in {written['upload_s']:.1f} s)"
            )
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in a.names}
        notes: set[str] = set()
        for round_ in range(a.rounds):
            for name in a.names if round_ % 2 == 0 else a.names[::-1]:
                if name == BASELINE:
                    spec = {"loader": "imgpipe-torch", "dtype": "uint8", "split": "train", "workers": a.workers, "epochs": a.epochs,
                            "src": str(src), "rec": str(rec), "batch_size": a.batch_size, "image_size": a.image_size}  # fmt: skip
                    result = in_own_process(spec, None)
                else:
                    cache = a.work / "peer-caches" / name
                    result = run_peer(a.peers_python, name, urls[name], server.url, cache, batch_size=a.batch_size, image_size=a.image_size,
                                      workers=a.workers, epochs=a.epochs)  # fmt: skip
                    notes.update(result["notes"])
                runs[name].append(result)
                f = epoch_figures(result)
                print(f"  round {round_ + 1}: {name:14s} cold {f[0]['images_per_s']:5.0f}, warm {f[-1]['images_per_s']:5.0f} images/s; "
                      f"GETs {[e['GET'] for e in f]}, MB {[round(e['MB']) for e in f]}", flush=True)  # fmt: skip
    for peer in (n for n in a.names if n in PEERS):
        print(f"{peer} decodes: {runs[peer][0]['decode']} ({runs[peer][0]['library']})")
    for note in sorted(notes):
        print(f"note: {note}")
    figures = report(runs)
    if a.json:
        a.json.write_text(json.dumps({"config": {k: str(v) for k, v in vars(a).items()}, **figures}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
