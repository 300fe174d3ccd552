"""imgpipe from a bucket, streamed and through a node-local cache, against imgpipe from a local folder and the peers.

One local S3-API server (``_s3_server.py``: moto, objects in memory, ``--latency-ms`` added to
every request, requests counted), one run, every row in a fresh process of its own, rounds
alternating their order; figures are medians over rounds, ratios are taken within a round.

Rows (2 loader workers, uint8 224 px train batches of 64, ImageNet-shaped JPEGs from
``_data.py``, shards of ``--shard-mb``; each process runs 2 epochs with persistent workers: the
first, loader construction included, is "cold", the second "warm"):

* ``imgpipe-local``: imgpipe's torch loader from the packed folder on the local disk (page cache warm);
* ``local+fill``: the local folder's epochs while another process fills a fresh ``cache_dir`` of
  the bucket (``OPEN_AND_FILL``, started with the loader): the same fill on the same cores, never
  waited for. Its cold epoch is the most a cold epoch through a cache can reach on this machine,
  whatever the order the bytes come in;
* ``imgpipe-cache``: from the bucket with an empty ``cache_dir``: the first epoch streams what it
  needs while the rest of the dataset is fetched in the background, the second reads the cache;
* ``imgpipe-stream``: from the bucket without a cache: images/s and range GETs per record;
* ``mosaic``, ``litdata`` (with ``--peers-python``): the peers from the same server, with their own
  local caches (``remote_peers.run_peer``: their shards of the same JPEGs, made once, uploaded).

Then ``imgpipe stage`` of the same folder against a boto3 s3transfer copy (``remote_stage.compare``),
and what a first epoch that stages first would take.

Time to the first batch (fresh interpreter, ``make_torch_loader`` and one batch of 256 at 64 px,
2 workers, after the imports) from a bucket holding an ImageNet-sized index (``--records`` tiny
JPEG records in ``--index-shards`` shards, ``open_index.build``): from the local folder, from the
bucket cold, through a ``cache_dir`` that holds the index (a process opened it once before), and
through a ``cache_dir`` that holds the whole dataset.

Every row quotes the requests per second the server answered, so a client limit can be told
from a server limit (moto is one Python process on the same cores: a few hundred small GETs/s),
and the client's CPU time per image (the loader's process, its workers and its store helper, and
a fill beside it; not the server's): a cold epoch through a cache is judged by that against a
local epoch, since its wall time on a few shared cores is bounded by the server's. The store
helper's own CPU time per epoch says what a cache's fill still does during the warm epoch. Wall-clock
figures on a shared machine: read the ratios. ``--baseline ROOT`` runs the local and cache rows
also with the imgpipe checkout at ROOT, in the same rounds (rows ``...@baseline``).

    python benchmarks/remote.py --peers-python /tmp/peers-venv/bin/python            # 3,000 JPEGs, 3 rounds
    python benchmarks/remote.py --peers-python /tmp/peers-venv/bin/python --quick    # 600 JPEGs, 1 round, a 128k-record index
    python benchmarks/remote.py --no-stage --no-first-batch --baseline /tmp/imgpipe-main  # this tree against another, alternating
"""

from __future__ import annotations

import argparse
import compileall
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

import _s3_server  # benchmarks/ is on sys.path when run as a script
from _data import describe_tree, make_imagenet_shaped
from _measure import child_pids, compile_bytecode, run_epochs
from remote_peers import PEERS, epoch_figures, prepare_peer, run_peer
from remote_stage import compare as compare_stage
from remote_stream import tiny_jpeg, upload  # puts tests/remote/ on sys.path
from s3_server import S3Server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCAL, BESIDE, CACHE, STREAM = "imgpipe-local", "local+fill", "imgpipe-cache", "imgpipe-stream"
ROWS = (LOCAL, BESIDE, CACHE, STREAM)
AT_BASELINE = "@baseline"
BUCKET = "imgpipe-bench"

FIRST_BATCH = """
import json, sys, time
t0 = time.perf_counter()
from imgpipe.loaders.torch import make_torch_loader
t1 = time.perf_counter()
loader = make_torch_loader(sys.argv[1], batch_size=256, image_size=64, workers=2, device=None, normalize=False, rank=0, world_size=1,
                           cache_dir=sys.argv[2] or None)
t2 = time.perf_counter()
images, labels = next(iter(loader))
t3 = time.perf_counter()
assert images.shape == (256, 3, 64, 64)
print(json.dumps({"open_s": t2 - t1, "first_batch_s": t3 - t1, "imports_s": t1 - t0}), flush=True)
"""

OPEN_AND_FILL = """
import os, sys, time
from imgpipe.cache.opening import open_shards
if sys.argv[3] == "beside":  # imported, then the loader beside it says go: the fill starts with the loader
    print("ready", flush=True)
    sys.stdin.readline()
open_shards(sys.argv[1], "train", cache_dir=sys.argv[2])
while sys.argv[3] != "index" and not os.path.exists(os.path.join(sys.argv[2], "manifest.json")):
    time.sleep(0.05)  # this process's store helper fills the cache meanwhile
os._exit(0)  # "index": the process ends before its filler got far
"""


# ----------------------------------------------------------------------------- child


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """(In a fresh process) one imgpipe loader's epochs, with the server's counts per epoch."""
    import torch

    from imgpipe.loaders.torch import make_torch_loader

    torch.set_num_threads(1)
    cache_dir = spec.get("cache_dir")
    beside = None
    if spec.get("fill_beside"):  # imported and waiting: the fill starts with the loader
        beside = subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_FILL, *spec["fill_beside"], "beside"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert beside.stdin is not None and beside.stdout is not None and beside.stdout.readline().strip() == "ready"

    def build() -> Any:
        if beside is not None:
            beside.stdin.write("go\n")  # type: ignore[union-attr]
            beside.stdin.flush()  # type: ignore[union-attr]
        return make_torch_loader(spec["data"], batch_size=spec["batch_size"], image_size=spec["image_size"], workers=spec["workers"],
                                 device=None, normalize=False, rank=0, world_size=1, cache_dir=cache_dir)  # fmt: skip

    def counters() -> dict[str, int]:  # the server's counts, and the CPU time of this process's store helper (the cache's fill)
        counted = _s3_server.fetch_counts(spec["endpoint"]) if spec.get("endpoint") else {}
        return {**counted, "helper_cpu_ms": helper_cpu_ms()}

    result = run_epochs(build, spec["epochs"], torch.uint8, counters)
    if beside is not None and beside.wait(timeout=600) != 0:
        raise SystemExit("the fill beside the local loader failed")
    if cache_dir:
        result["cache_complete"] = (Path(cache_dir) / "manifest.json").is_file()
    return result


def helper_cpu_ms() -> int:
    """CPU milliseconds so far of this process's store helpers (where a cache's background fill runs)."""
    total = 0.0
    for pid in child_pids():
        try:
            if b"imgpipe.storage.store_helper" in Path(f"/proc/{pid}/cmdline").read_bytes():
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return int(total * 1000)


def cpu_ms(result: dict[str, Any], epoch: int) -> float:
    """The client's CPU milliseconds per image of one epoch: the loader's process, its workers, its store helper."""
    figures = result["epochs"][epoch]
    return 1000 * figures["cpu_s"] / figures["images"]


def run_child(spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{spec['name']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_script(code: str, *args: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise SystemExit(f"a first-batch probe failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


# ----------------------------------------------------------------------------- rows


def prepare(a: argparse.Namespace) -> tuple[Path, Path]:
    """The ImageNet-shaped tree and its pack in shards of ``--shard-mb`` under ``--work`` (reused)."""
    import imgpipe
    from imgpipe.format.manifest import manifest_path

    src = make_imagenet_shaped(a.work / f"imagenet-shaped-{a.images}", a.images, a.classes, workers=len(os.sched_getaffinity(0)))
    rec = a.work / f"rec-imagenet-shaped-{a.images}-{a.shard_mb}mb"
    if not manifest_path(rec).is_file():
        imgpipe.pack(src, rec, splits=["train"], shard_size=a.shard_mb * 10**6, workers=2, overwrite=True, progress=False)
    return src, rec


def first_batches(a: argparse.Namespace, server: Any, env: dict[str, str], work: Path) -> dict[str, list[dict[str, Any]]]:
    """Time to the first batch from the ImageNet-sized index: local, bucket cold, cache holding the index, cache complete."""
    from open_index import build as build_index  # here: a --baseline child imports this module with another imgpipe

    index = a.work / f"index-{a.records}-{a.index_shards}"
    if not (index / "manifest.json").is_file():
        build_index(index, a.records, a.index_shards, payload=tiny_jpeg())
    url = upload(server, index, f"index-{a.records}")
    held, whole = work / "cache-index", work / "cache-whole"
    run_script(OPEN_AND_FILL, url, str(held), "index", env=env)  # the index fetched into the cache, and no more
    opened = time.perf_counter()
    run_script(OPEN_AND_FILL, url, str(whole), "whole", env=env)
    print(f"index: {a.records:,} records in {a.index_shards} shards; a cache of all of it filled in {time.perf_counter() - opened:.0f} s")
    cases = {
        "local folder": (str(index), ""),
        "bucket, cold": (url, ""),
        "cache holding the index": (url, str(held)),
        "cache complete": (url, str(whole)),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for round_ in range(a.rounds):
        for name in cases if round_ % 2 == 0 else list(cases)[::-1]:
            data, cache = cases[name]
            before = server.counts()
            result = run_script(FIRST_BATCH, data, cache, env=env)
            after = server.counts()
            result["GET"] = after.get("GET", 0) - before.get("GET", 0)
            runs[name].append(result)
    return runs


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    compile_bytecode()
    if a.baseline:
        compileall.compile_dir(a.baseline / "imgpipe", quiet=1)
    src, rec = prepare(a)
    train = src / "train"
    print(f"data: {a.images} train JPEGs ({describe_tree(train)}), {a.shard_mb} MB shards; batch {a.batch_size}, {a.image_size} px uint8, "
          f"{a.workers} workers; 2 epochs per process (the first cold); medians of {a.rounds} round(s); "
          f"{a.latency_ms:.0f} ms per request")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="remote-bench.") as tmp, S3Server(lifetime_s=7200, latency_s=a.latency_ms / 1e3) as server:
        work = Path(tmp)
        os.environ.update(server.env())  # for the peers' children too
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        }
        url = upload(server, rec, rec.name)
        peers = [p for p in PEERS if a.peers_python and not a.no_epochs]
        urls = {}
        for peer in peers:
            written = prepare_peer(a.peers_python, peer, train, a.work, server.endpoint, shard_mb=a.shard_mb)
            urls[peer] = written["url"]
        rows = [row for row in ROWS if row in a.rows]
        baseline = [f"{name}{AT_BASELINE}" for name in (LOCAL, CACHE) if name in rows] if a.baseline else []
        names = [*rows, *baseline, *peers] if not a.no_epochs else []
        runs: dict[str, list[dict[str, Any] | None]] = {name: [] for name in names}
        failures: list[str] = []
        for round_ in range(a.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                spec = {
                    "name": name,
                    "batch_size": a.batch_size,
                    "image_size": a.image_size,
                    "workers": a.workers,
                    "epochs": 2,
                    "endpoint": server.endpoint,
                }
                if name in PEERS:
                    try:
                        result = run_peer(a.peers_python, name, urls[name], server.endpoint, work / "peer-cache", batch_size=a.batch_size,
                                          image_size=a.image_size, workers=a.workers, epochs=2)  # fmt: skip
                    except (
                        SystemExit
                    ) as e:  # a peer that fails in one round (LitData's forked workers can hang on a chunk) is left out of it
                        failures.append(f"{name}, round {round_ + 1}: {str(e).strip().splitlines()[-1][:300]}")
                        runs[name].append(None)
                        print(f"  round {round_ + 1}: {name:15s} FAILED (left out of this round)", flush=True)
                        continue
                else:
                    cache = work / "cache"
                    shutil.rmtree(cache, ignore_errors=True)
                    row = name.removesuffix(AT_BASELINE)
                    spec.update(data=str(rec) if row in (LOCAL, BESIDE) else url, cache_dir=str(cache) if row == CACHE else None)
                    if row == BESIDE:
                        spec["fill_beside"] = [url, str(cache)]
                    result = run_child(spec, {**env, "PYTHONPATH": str(a.baseline)} if row != name else env)
                    shutil.rmtree(cache, ignore_errors=True)
                runs[name].append(result)
                f = epoch_figures(result)
                extra = f", cache complete after 2 epochs: {result['cache_complete']}" if "cache_complete" in result else ""
                print(f"  round {round_ + 1}: {name:24s} cold {f[0]['images_per_s']:5.0f}, warm {f[1]['images_per_s']:5.0f} images/s, "
                      f"CPU {cpu_ms(result, 0):5.1f}/{cpu_ms(result, 1):5.1f} ms per image "
                      f"(store helper {'/'.join(str(e['counters'].get('helper_cpu_ms', 0)) for e in result['epochs'])} ms); "
                      f"GETs {[e['GET'] for e in f]}, range GETs {[e['range_GET'] for e in f]}, "
                      f"requests/s {[round(e['requests_per_s']) for e in f]}{extra}",
                      flush=True)  # fmt: skip
        stage = compare_stage(url, env, work, rounds=a.rounds, counts=server.counts) if not (a.no_stage or a.no_epochs) else {}
        first = first_batches(a, server, env, work) if not a.no_first_batch else {}
    for failure in failures:
        print(f"failed: {failure}")
    report(runs, first, a)
    if stage:
        report_stage(stage, runs)
    return 0


# ----------------------------------------------------------------------------- report


def report(runs: dict[str, list[dict[str, Any] | None]], first: dict[str, list[dict[str, Any]]], a: argparse.Namespace) -> None:
    if runs:
        report_epochs(runs, a)
    if first:
        report_first_batches(first, a)


def report_epochs(runs: dict[str, list[dict[str, Any] | None]], a: argparse.Namespace) -> None:
    by_round = {name: [None if r is None else epoch_figures(r) for r in results] for name, results in runs.items()}
    figures = {name: [f for f in rounds if f is not None] for name, rounds in by_round.items()}
    images = next(r for results in runs.values() for r in results if r is not None)["epochs"][0]["images"]
    print(
        f"\n{'loader':24s} {'cold img/s':>10s} {'warm img/s':>10s} {'CPU ms/img cold/warm':>21s} {'helper CPU-s cold/warm':>23s} "
        f"{'range GETs/record cold/warm':>28s} {'MB cold':>8s} {'requests/s cold/warm':>21s}"
    )
    for name, rounds in figures.items():
        if not rounds:
            print(f"{name:24s} failed in every round")
            continue
        cold = statistics.median(f[0]["images_per_s"] for f in rounds)
        warm = statistics.median(f[1]["images_per_s"] for f in rounds)
        cpu = "/".join(f"{statistics.median(f[k]['cpu_ms_per_image'] for f in rounds):.1f}" for k in (0, 1))
        helper = "/".join(f"{statistics.median(f[k]['helper_cpu_s'] for f in rounds):.2f}" for k in (0, 1))
        per_record = "/".join(f"{statistics.median(f[k]['range_GET'] for f in rounds) / images:.3f}" for k in (0, 1))
        mb = statistics.median(f[0]["MB"] for f in rounds)
        rate = "/".join(f"{statistics.median(f[k]['requests_per_s'] for f in rounds):.0f}" for k in (0, 1))
        print(f"{name:24s} {cold:10.0f} {warm:10.0f} {cpu:>21s} {helper:>23s} {per_record:>28s} {mb:8.0f} {rate:>21s}")

    def ratio(mine: str, epoch: int, theirs: list[str], their_epoch: int, key: str = "images_per_s") -> float:
        """The median over rounds of ``mine`` over the best of ``theirs`` that ran in that round."""
        ratios = []
        for r in range(a.rounds):
            best = [by_round[t][r][their_epoch][key] for t in theirs if t in by_round and by_round[t][r] is not None]  # type: ignore[index]
            if best and by_round.get(mine) and by_round[mine][r] is not None:
                ratios.append(by_round[mine][r][epoch][key] / (max(best) if key == "images_per_s" else min(best)))  # type: ignore[index]
        return statistics.median(ratios) if ratios else float("nan")

    cpu = "cpu_ms_per_image"

    peers = [p for p in PEERS if figures.get(p)]
    goals = [("cache, first epoch (cold) / local folder, first epoch", ratio(CACHE, 0, [LOCAL], 0), 0.9),
             ("cache, second epoch / local folder, second epoch", ratio(CACHE, 1, [LOCAL], 1), 0.95),
             ("CPU per image: cache, first epoch / local folder, first epoch", ratio(CACHE, 0, [LOCAL], 0, cpu), -1.25),
             ("CPU per image: cache, second epoch / local folder, second epoch", ratio(CACHE, 1, [LOCAL], 1, cpu), None),
             ("local folder beside the same fill, first epoch / local folder alone (this machine's ceiling)",
              ratio(BESIDE, 0, [LOCAL], 0), None),
             ("cache, first epoch / local folder beside the same fill, first epoch", ratio(CACHE, 0, [BESIDE], 0), None),
             ("stream, second epoch / local folder, second epoch", ratio(STREAM, 1, [LOCAL], 1), None)]  # fmt: skip
    if a.baseline:
        base_local, base_cache = f"{LOCAL}{AT_BASELINE}", f"{CACHE}{AT_BASELINE}"
        goals += [("baseline: cache, first epoch / local folder, first epoch", ratio(base_cache, 0, [base_local], 0), None),
                  ("baseline: cache, second epoch / local folder, second epoch", ratio(base_cache, 1, [base_local], 1), None),
                  ("baseline: CPU per image, cache first epoch / local first epoch", ratio(base_cache, 0, [base_local], 0, cpu), None),
                  ("this tree's cache, second epoch / the baseline's", ratio(CACHE, 1, [base_cache], 1), None),
                  ("this tree's cache CPU per image, first epoch / the baseline's",
                   ratio(CACHE, 0, [base_cache], 0, cpu), None)]  # fmt: skip
    if peers:
        goals += [(f"cache, first epoch / the better peer's cold first epoch ({', '.join(peers)})", ratio(CACHE, 0, peers, 0), 1.5),
                  ("cache, second epoch / the better peer's warm epoch", ratio(CACHE, 1, peers, 1), 1.0)]  # fmt: skip
    print("\nratios (median over rounds of the ratio within each round)")
    for what, value, goal in goals:  # a negative goal is an upper bound
        if goal is None:
            goal_note = ""
        elif goal < 0:
            goal_note = f"  goal <= {-goal}: {'met' if value <= -goal else 'MISSED'}"
        else:
            goal_note = f"  goal >= {goal}: {'met' if value >= goal else 'MISSED'}"
        print(f"  {what:75s} {value:5.2f}x{goal_note}")


def report_stage(stage: dict[str, Any], runs: dict[str, list[dict[str, Any] | None]]) -> None:
    """``imgpipe stage`` of the same folder against boto3's s3transfer, and what a staged first epoch would take."""
    ours, theirs = stage["imgpipe stage"], stage["boto3 s3transfer"]
    print(f"\nimgpipe stage of the same {ours['bytes'] / 1e6:.0f} MB (medians of {stage['rounds']} rounds, alternating with boto3):")
    print(f"  imgpipe stage {ours['seconds']:5.2f} s ({ours['mb_s']:.0f} MB/s), "
          f"boto3 s3transfer {theirs['seconds']:5.2f} s ({theirs['mb_s']:.0f} MB/s): "
          f"{stage['ratio']:.2f}x boto3's time  goal <= 1.1x: {'met' if stage['ratio'] <= 1.1 else 'MISSED'}")  # fmt: skip
    local = [epoch_figures(r)[0] for r in runs.get(LOCAL, []) if r is not None]
    if local:
        images = next(r for results in runs.values() for r in results if r is not None)["epochs"][0]["images"]
        cold = statistics.median(f["images_per_s"] for f in local)
        print(f"  staged, then the local folder's cold epoch: {images / (ours['seconds'] + images / cold):.0f} images/s "
              "over the first epoch "
              f"(the copy, then {cold:.0f} images/s)")  # fmt: skip


def report_first_batches(first: dict[str, list[dict[str, Any]]], a: argparse.Namespace) -> None:
    print(
        f"\ntime to the first batch, {a.records:,} records in {a.index_shards} shards "
        "(fresh interpreter, after the imports; batch 256, 64 px, 2 workers):"
    )
    goals_s = {"bucket, cold": 5.0, "cache holding the index": 1.0, "cache complete": 1.0}
    for name, results in first.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        goal = f"  goal <= {goals_s[name]:.0f} s: {'met' if med['first_batch_s'] <= goals_s[name] else 'MISSED'}" if name in goals_s else ""
        gets = f", {med['GET']:.0f} GETs" if name != "local folder" else ""
        print(f"  {name:24s} open {med['open_s']:5.2f} s, first batch {med['first_batch_s']:5.2f} s{gets}{goal}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument(
        "--peers-python", type=Path, help="the interpreter of the peers' venv (bash benchmarks/peers_env.sh VENV); without it, no peer rows"
    )
    p.add_argument("--images", type=int, default=3000, help="ImageNet-shaped train JPEGs")
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--shard-mb", type=int, default=16, help="shard size, imgpipe's and the peers'")
    p.add_argument("--records", type=int, default=1_281_167, help="records of the index for the time to the first batch")
    p.add_argument("--index-shards", type=int, default=1000)
    p.add_argument("--no-first-batch", action="store_true", help="skip the time to the first batch")
    p.add_argument("--no-epochs", action="store_true", help="only the time to the first batch")
    p.add_argument("--no-stage", action="store_true", help="skip imgpipe stage against boto3 (benchmarks/remote_stage.py's rounds)")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=lambda text: text.split(","), default=list(ROWS), help=f"imgpipe rows to run (default: {','.join(ROWS)})")
    p.add_argument("--baseline", type=Path, help="another imgpipe checkout whose local and cache rows run in the same rounds")
    p.add_argument("--quick", action="store_true", help="600 images, 1 round, a 128,000-record index in 100 shards")
    p.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench-loaders", help="data folder (reused between runs)"
    )
    a = p.parse_args(argv)
    if a.quick:
        a.images, a.classes, a.rounds, a.records, a.index_shards = 600, 10, 1, 128_000, 100
    if a.peers_python is not None and not a.peers_python.is_file():
        p.error(f"--peers-python {a.peers_python}: no such interpreter (bash benchmarks/peers_env.sh VENV builds one)")
    return a


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
