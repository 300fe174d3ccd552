"""Loader throughput, like for like, each loader alone in a process of its own.

Loaders: imgpipe's torch loader, torchvision's ImageFolder + DataLoader, the textbook DALI CPU
pipeline (``readers.mxnet`` -> random crop / resize -> ``crop_mirror_normalize``), imgpipe's DALI
loader, and ``imgpipe-torch-whole`` (imgpipe's torch loader as an install without its region
decoder runs it). Every row compares like for like: the same data, the same train geometry
(RandomResizedCrop 0.08-1, 3/4-4/3, bilinear antialiased, + flip; val: resize the shorter side to
size/0.875 + center crop), the same output (float32 NCHW normalized with ImageNet mean/std, or
uint8 NCHW), the same batch size, and as many DataLoader workers as DALI threads, on the CPU.

With ``--ffcv-python`` (the interpreter of FFCV's own venv, which ``benchmarks/ffcv_env.sh``
builds), the ``ffcv`` row (train only) is FFCV 1.0.2's ``Loader`` with as many threads, run by
``_ffcv_child.py``: ``RandomResizedCropRGBImageDecoder`` (the same ranges; OpenCV's area resize)
+ flip, ``NormalizeImage(float32)`` in its threads for float32, the same contiguous NCHW outputs,
from a page-cached .beton that its writer makes once beside the data, re-encoding every JPEG at
quality 90 (so its JPEGs are smaller than the others'). Its first epoch includes numba compiling
the pipeline.

The default data is ImageNet-shaped (``_data.make_imagenet_shaped``: median 500x375, ~110 KB,
2-3 % above 1,000 px; train only); ``--data synth`` uses ``imgpipe synth``'s smaller pictures.

Each (loader, output, workers) runs in a fresh process of its own (``--child``), so no loader's
threads or workers share the machine with another's, and runs ``--epochs`` epochs there with
persistent workers: the first epoch, loader construction and worker start-up included, is
reported apart from the steady state (the median of the later epochs). A round runs every
configuration once, one after the other, plus a single-process Pillow decode-only pass (the
per-core reference), in the opposite order every other round; ratios are taken within a round and the median over ``--rounds`` rounds is
reported, since a shared machine's speed drifts by 20-30 % over minutes. Per-core rates divide by
min(workers, CPUs); images per CPU-second (the process, its threads and its workers) is the
steadier measure on a machine shared with other work. Worker and main-process RSS (and private memory) are sampled after every epoch.

    python benchmarks/loaders.py                      # ImageNet-shaped, 3,000 JPEGs, at 2 and all workers
    python benchmarks/loaders.py --data synth --quick --workers 2
    bash benchmarks/ffcv_env.sh /tmp/ffcv-venv
    python benchmarks/loaders.py --workers 2 --only imgpipe-torch --ffcv-python /tmp/ffcv-venv/bin/python
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
from typing import Any, Iterable

import torch
from _data import describe_tree, make_imagenet_shaped  # benchmarks/ is on sys.path when run as a script
from _measure import compile_bytecode, run_epochs
from PIL import Image

import imgpipe
from imgpipe.format.manifest import manifest_path
from imgpipe.format.shardset import open_shardset
from imgpipe.loaders.dali_index import write_dali_index
from imgpipe.loaders.geometry import IMAGENET_MEAN, IMAGENET_STD, EvalGeometry
from imgpipe.loaders.pixels import describe_jpeg_decoder, region_decoder

LOADERS = ("imgpipe-torch", "imgpipe-torch-whole", "torchvision", "dali-plain", "imgpipe-dali")
DEFAULT_LOADERS = ("imgpipe-torch", "torchvision", "dali-plain", "imgpipe-dali")
FFCV = "ffcv"  # with --ffcv-python: FFCV 1.0.2 in its own venv (_ffcv_child.py), train only
FFCV_CHILD = Path(__file__).with_name("_ffcv_child.py")
DTYPES = ("float32", "uint8")
# (mine, theirs, output, goal) as issue 15's table: steady-state ratios of images/s
GOALS = (
    ("imgpipe-torch", "torchvision", "float32", 2.0),
    ("imgpipe-torch", "dali-plain", "float32", 1.0),
    ("imgpipe-torch", "torchvision", "uint8", 2.0),
    ("imgpipe-torch", "dali-plain", "uint8", None),
    ("imgpipe-dali", "dali-plain", "float32", 0.95),  # issue 12: the same decode and resize work
    ("imgpipe-torch", "imgpipe-torch-whole", "uint8", None),  # an install with the region decoder, and one without (docs/install.md)
    ("imgpipe-torch", "imgpipe-torch-whole", "float32", None),
    ("imgpipe-torch-whole", "torchvision", "uint8", None),
    ("imgpipe-torch-whole", "torchvision", "float32", None),
    ("imgpipe-torch", FFCV, "uint8", 1.3),  # FFCV's Loader from its page-cached .beton
    ("imgpipe-torch", FFCV, "float32", 1.0),  # with NormalizeImage(float32) in FFCV's threads
)
PER_CORE_GOAL = 1.0  # imgpipe-torch uint8 images/s per core over Pillow's single-process whole-decode rate


# ----------------------------------------------------------------------------- data


def prepare(a: argparse.Namespace) -> tuple[Path, Path]:
    """The source tree and its pack under ``a.work`` (reused when already there)."""
    if a.data == "imagenet":
        src = make_imagenet_shaped(a.work / f"imagenet-shaped-{a.images}", a.images, a.classes, a.prepare_workers)
        rec, splits = a.work / f"rec-imagenet-shaped-{a.images}", ["train"]
    else:
        from imgpipe.synth.tree import make_synthetic

        src, rec, splits = a.work / f"src-{a.classes}x{a.per_class}", a.work / f"rec-{a.classes}x{a.per_class}", ["train", "val"]
        if not (src / "LOC_val_solution.csv").is_file():
            make_synthetic(src, classes=a.classes, per_class=a.per_class, val_per_class=a.val_per_class, seed=0, progress=False)
    if not manifest_path(rec).is_file():
        imgpipe.pack(src, rec, splits=splits, workers=a.prepare_workers, overwrite=True, progress=False)
    return src, rec


def prepare_ffcv(a: argparse.Namespace, src: Path) -> Path:
    """FFCV's .beton of the train tree beside it (its writer re-encodes every JPEG at quality 90); made once."""
    beton = a.work / f"ffcv-{src.name}-train-q90.beton"
    if not beton.is_file():
        began = time.perf_counter()
        spec = {"train": str(src / "train"), "beton": str(beton), "workers": a.prepare_workers}
        run_script([str(a.ffcv_python), str(FFCV_CHILD), "write", json.dumps(spec)], "ffcv's writer")
        print(f"ffcv: wrote {beton} in {time.perf_counter() - began:.0f} s")
    print(f"ffcv: {beton} ({beton.stat().st_size / 1e6:.0f} MB; JPEGs re-encoded at quality 90 by its writer)")
    return beton


# ----------------------------------------------------------------------------- loaders (built in the child process)


def imgpipe_torch(rec: Path, train: bool, s: dict[str, Any]) -> Any:
    return imgpipe.make_torch_loader(
        rec,
        "train" if train else "val",
        batch_size=s["batch_size"],
        train=train,
        image_size=s["image_size"],
        workers=s["workers"],
        device=None,
        normalize=s["dtype"] == "float32",
    )


def imgpipe_torch_whole(rec: Path, train: bool, s: dict[str, Any]) -> Any:
    """imgpipe's torch loader decoding whole JPEGs with torchvision, as an install without the region decoder runs it."""
    from imgpipe.loaders import pixels

    pixels.region_decoder = lambda: None  # this process runs only this loader; its forked workers inherit it
    return imgpipe_torch(rec, train, s)


def imgpipe_dali(rec: Path, train: bool, s: dict[str, Any]) -> Any:
    return imgpipe.make_dali_loader(
        rec,
        "train" if train else "val",
        batch_size=s["batch_size"],
        train=train,
        image_size=s["image_size"],
        workers=s["workers"],
        device=None,
        normalize=s["dtype"] == "float32",
    )


def torchvision_baseline(src: Path, train: bool, s: dict[str, Any]) -> Any:
    """ImageFolder (train) or the flat val folder + its CSV labels, PIL transforms, a plain DataLoader."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import default_loader

    from imgpipe.ingest.scan import scan

    size = s["image_size"]
    if s["dtype"] == "float32":
        out = [T.ToTensor(), T.Normalize([m / 255 for m in IMAGENET_MEAN], [d / 255 for d in IMAGENET_STD])]
    else:
        out = [T.PILToTensor()]
    if train:
        tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *out])
        dataset: Any = ImageFolder(str(src / "train"), transform=tf)
    else:
        tf = T.Compose([T.Resize(EvalGeometry(image_size=size).resize_shorter), T.CenterCrop(size), *out])
        items = scan(src, ["val"]).splits["val"]
        samples = [(str(src / p), int(label)) for p, label in zip(items.paths, items.labels)]

        class ValFolder(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return len(samples)

            def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
                path, label = samples[i]
                return tf(default_loader(path)), label

        dataset = ValFolder()
    workers = s["workers"]
    return torch.utils.data.DataLoader(
        dataset, batch_size=s["batch_size"], shuffle=train, drop_last=train, num_workers=workers, persistent_workers=workers > 0
    )


class PlainDali:
    """The textbook DALI CPU pipeline: readers.mxnet -> image_random_crop / resize -> crop_mirror_normalize."""

    def __init__(self, rec: Path, train: bool, s: dict[str, Any]) -> None:
        from nvidia.dali import Pipeline, fn, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        shards = open_shardset(rec, "train" if train else "val")
        size = s["image_size"]
        pipe = Pipeline(batch_size=s["batch_size"], num_threads=max(1, s["workers"]), device_id=None, seed=0)
        with pipe:
            jpegs, labels = fn.readers.mxnet(
                path=[str(p) for p in shards.rec_paths],
                index_path=[str(write_dali_index(shards))],
                random_shuffle=train,
                pad_last_batch=not train,
                name="Reader",
            )
            if train:
                images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_x=size, resize_y=size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=EvalGeometry(image_size=size).resize_shorter)
                mirror = 0
            if s["dtype"] == "float32":
                out = {"dtype": types.FLOAT, "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
            else:
                out = {"dtype": types.UINT8}
            images = fn.crop_mirror_normalize(images, output_layout="CHW", crop=(size, size), mirror=mirror, **out)
            pipe.set_outputs(images, labels)
        policy = LastBatchPolicy.DROP if train else LastBatchPolicy.PARTIAL
        self._it = DALIGenericIterator([pipe], ["images", "labels"], reader_name="Reader", last_batch_policy=policy)

    def __len__(self) -> int:
        return len(self._it)

    def __iter__(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        for (out,) in self._it:
            yield out["images"], out["labels"].reshape(-1).long()


MAKERS = {
    "imgpipe-torch": lambda src, rec, train, s: imgpipe_torch(rec, train, s),
    "imgpipe-torch-whole": lambda src, rec, train, s: imgpipe_torch_whole(rec, train, s),
    "torchvision": lambda src, rec, train, s: torchvision_baseline(src, train, s),
    "dali-plain": lambda src, rec, train, s: PlainDali(rec, train, s),
    "imgpipe-dali": lambda src, rec, train, s: imgpipe_dali(rec, train, s),
}


# ----------------------------------------------------------------------------- measuring


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """(In the child process) build one loader and run ``spec["epochs"]`` epochs of it; the first
    epoch's time includes building the loader and starting its workers."""
    torch.set_num_threads(1)  # the main process of a training loop; DALI's threads and the workers are the loader's

    def build() -> Any:
        return MAKERS[spec["loader"]](Path(spec["src"]), Path(spec["rec"]), spec["split"] == "train", spec)

    return run_epochs(build, spec["epochs"], getattr(torch, spec["dtype"]))


def run_script(command: list[str], what: str) -> str:
    """The standard output of ``command``; its failure stops the benchmark."""
    run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"{what} failed:\n{run.stderr[-3000:]}")
    return run.stdout


def in_own_process(spec: dict[str, Any], ffcv_python: Path | None) -> dict[str, Any]:
    """``run_child(spec)`` in a fresh Python process (this script with ``--child``; FFCV's venv runs ``_ffcv_child.py``)."""
    if spec["loader"] == FFCV:
        command = [str(ffcv_python), str(FFCV_CHILD), "run", json.dumps(spec)]
    else:
        command = [sys.executable, __file__, "--child", json.dumps(spec)]
    out = run_script(command, f"{spec['loader']} {spec['dtype']} ({spec['workers']} workers)")
    return json.loads(out.strip().splitlines()[-1])


def decode_all(payloads: list[bytes]) -> None:
    """Decode every payload once with Pillow."""
    for payload in payloads:
        Image.open(io.BytesIO(payload)).convert("RGB").load()


def decode_in_child(rec: Path, repeats: int, start: Any, results: Any) -> None:
    """(Forked child) read every train JPEG, wait for ``start``, decode them ``repeats`` times; send
    (images/s, images per CPU-second) of each pass through ``results``."""
    shards = open_shardset(rec, "train")
    payloads = [shards.read(i)[1] for i in range(len(shards))]
    start.wait()
    for _ in range(repeats):
        began, cpu = time.perf_counter(), time.process_time()
        decode_all(payloads)
        results.put((len(payloads) / (time.perf_counter() - began), len(payloads) / max(time.process_time() - cpu, 1e-9)))


def decode_in_children(rec: Path, count: int, repeats: int) -> list[tuple[float, float]]:
    """(images/s, images per CPU-second) of every pass of ``count`` forked children decoding at once, ``repeats`` passes each.

    Children, so this process never holds the payloads: a parent whose heap has just freed
    hundreds of MB hands that fragmented heap to the loaders' forked workers, whose private
    memory then grows epoch after epoch (measured with the old Pillow loader and the new one
    alike), which is not how a training script starts its loaders.
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(count + 1), context.Queue()
    children = [context.Process(target=decode_in_child, args=(rec, repeats, start, results)) for _ in range(count)]
    for child in children:
        child.start()
    start.wait()
    passes = [results.get() for _ in range(count * repeats)]
    for child in children:
        child.join()
    return passes


def rates(result: dict[str, Any]) -> dict[str, Any]:
    """First-epoch and steady-state images/s (and images per CPU-second) of one child's epochs."""
    epochs = result["epochs"]
    steady = epochs[1:] or epochs
    return {
        "first": epochs[0]["images"] / epochs[0]["wall_s"],
        "steady": statistics.median(e["images"] / e["wall_s"] for e in steady),
        "steady_per_cpu_s": statistics.median(e["images"] / max(e["cpu_s"], 1e-9) for e in steady),
    }


def median_ratio(mine: list[dict[str, Any]], theirs: list[dict[str, Any]], key: str) -> tuple[float, list[float]]:
    """The median over rounds of ``mine``'s ``key`` rate over ``theirs``, with the rounds' ratios."""
    rounds = [rates(m)[key] / rates(t)[key] for m, t in zip(mine, theirs)]
    return statistics.median(rounds), rounds


def goal_check(value: float, goal: float | None) -> str:
    return "" if goal is None else f"goal >= {goal}x: {'PASS' if value >= goal else 'MISS'}"


def report(
    runs: dict[str, list[dict[str, Any]]], decode: list[tuple[float, float]], workers: list[int], cpus: int, a: argparse.Namespace
) -> dict[str, Any]:
    """Print the tables (rates, memory, ratios against the goals) and return them as figures."""
    figures: dict[str, Any] = {}
    print(f"\n{'loader':20s} {'output':7s} {'split':5s} {'wk':>2s} {'first':>7s} {'steady':>7s} {'/core':>6s} {'/CPU-s':>6s}"
          "  worker RSS MB per epoch (private) | main RSS MB (private)")  # fmt: skip
    for key, results in runs.items():
        name, dtype, split, w = key.split("|")
        r = {k: statistics.median(rates(x)[k] for x in results) for k in ("first", "steady", "steady_per_cpu_s")}
        last = results[-1]["epochs"]
        workers_mb = (
            f"{[round(e['worker_rss_mb']) for e in last]} ({[round(e['worker_private_mb']) for e in last]})"
            if last[0]["worker_rss_mb"]
            else "(threads, no workers)"
        )
        memory = f"{workers_mb} | {[round(e['main_rss_mb']) for e in last]} ({[round(e['main_private_mb']) for e in last]})"
        per_core = r["steady"] / min(max(1, int(w)), cpus)
        print(
            f"{name:20s} {dtype:7s} {split:5s} {w:>2s} {r['first']:7.0f} {r['steady']:7.0f} {per_core:6.0f} "
            f"{r['steady_per_cpu_s']:6.0f}  {memory}"
        )
        figures[key] = {**r, "per_core": per_core, "rounds": [rates(x) for x in results], "last_round_epochs": last}
    rate, per_cpu = statistics.median(r for r, _ in decode), statistics.median(c for _, c in decode)
    print(f"{'pillow decode-only':20s} {'uint8':7s} train  1 {'':7s} {rate:7.0f} {rate:6.0f} {per_cpu:6.0f}  (one process, whole decode)")
    figures["decode_only"] = decode
    print(
        "\nratios: median over rounds of the ratio within each round (steady state; first epoch in brackets); goals from issues 12 and 15"
    )
    for split in a.splits:
        for w in workers:
            for mine, theirs, dtype, goal in GOALS:
                k_mine, k_theirs = f"{mine}|{dtype}|{split}|{w}", f"{theirs}|{dtype}|{split}|{w}"
                if k_mine not in runs or k_theirs not in runs:
                    continue
                steady, rounds = median_ratio(runs[k_mine], runs[k_theirs], "steady")
                first, _ = median_ratio(runs[k_mine], runs[k_theirs], "first")
                per_cpu, _ = median_ratio(runs[k_mine], runs[k_theirs], "steady_per_cpu_s")
                goal = goal if split == "train" else None
                print(f"  {mine} / {theirs:20s} {dtype:7s} {split:5s} {w:2d} workers {steady:5.2f}x "
                      f"({first:4.2f}x, per CPU-s {per_cpu:4.2f}x)  {goal_check(steady, goal):18s} "
                      f"rounds {', '.join(f'{x:.2f}' for x in rounds)}")  # fmt: skip
                figures[f"ratio {mine}/{theirs} {dtype} {split} {w}"] = {
                    "steady": steady,
                    "first": first,
                    "per_cpu_s": per_cpu,
                    "rounds": rounds,
                }
            k = f"imgpipe-torch|uint8|train|{w}"
            if split == "train" and k in runs:
                cores = min(w, cpus)
                pairs = [rates(x)["steady"] / cores / rate for x, (rate, _) in zip(runs[k], decode)]
                per_core = statistics.median(pairs)
                per_cpu = statistics.median(rates(x)["steady_per_cpu_s"] / cpu for x, (_, cpu) in zip(runs[k], decode))
                print(f"  imgpipe-torch per core / Pillow decode-only   uint8   train {w:2d} workers {per_core:5.2f}x "
                      f"(per CPU-s {per_cpu:4.2f}x)  {goal_check(per_core, PER_CORE_GOAL):18s} "
                      f"rounds {', '.join(f'{x:.2f}' for x in pairs)}")  # fmt: skip
                figures[f"ratio per core / decode-only uint8 train {w}"] = {"steady": per_core, "per_cpu_s": per_cpu, "rounds": pairs}
    return figures


# ----------------------------------------------------------------------------- main


def worker_counts(text: str, cpus: int) -> list[int]:
    """``--workers`` ("2,all") as distinct counts; "all" is the CPUs available."""
    counts = [cpus if w.strip() == "all" else int(w) for w in text.split(",") if w.strip()]
    return list(dict.fromkeys(counts))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--data", choices=["imagenet", "synth"], default="imagenet", help="ImageNet-shaped JPEGs (train only), or imgpipe synth's"
    )
    p.add_argument("--images", type=int, default=3000, help="ImageNet-shaped train JPEGs")
    p.add_argument("--quick", action="store_true", help="smaller data (600 images; synth: 10 classes x 40 + 10 val), 2 rounds")
    p.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench-loaders", help="data folder (reused between runs)"
    )
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--per-class", type=int, default=100, help="synth: train images per class")
    p.add_argument("--val-per-class", type=int, default=20, help="synth: val images per class")
    p.add_argument("--splits", default="train", help="train and/or val (val: --data synth only)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument(
        "--workers", default="2,all", help="comma-separated DataLoader worker (= DALI thread) counts; 'all' = the CPUs available"
    )
    p.add_argument("--epochs", type=int, default=4, help="epochs per process: the first (start-up included), then the steady state")
    p.add_argument("--rounds", type=int, default=3, help="every configuration once per round, each in its own process")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="float32 (normalized) and/or uint8")
    p.add_argument("--only", default=",".join(DEFAULT_LOADERS), help=f"comma-separated subset of {', '.join(LOADERS)}")
    p.add_argument("--ffcv-python", type=Path, help="add the ffcv row (train): the interpreter of FFCV's venv (benchmarks/ffcv_env.sh)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.images, a.classes, a.per_class, a.val_per_class, a.rounds = 600, 10, 40, 10, 2
    a.splits = [x.strip() for x in a.splits.split(",") if x.strip()]
    if a.ffcv_python and not a.ffcv_python.is_file():
        p.error(f"--ffcv-python {a.ffcv_python}: no such interpreter (bash benchmarks/ffcv_env.sh VENV builds one)")
    if "val" in a.splits and a.data != "synth":
        p.error("the ImageNet-shaped data has no val split: use --data synth for val")
    a.epochs, a.rounds = max(2, a.epochs), max(1, a.rounds)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    compile_bytecode()
    if a.child:
        print(json.dumps(run_child(json.loads(a.child))))
        return 0
    from imgpipe.loaders.dali import dali_available

    names = [n.strip() for n in a.only.split(",") if n.strip()]
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    if set(names) - set(LOADERS) or set(dtypes) - set(DTYPES):
        sys.exit(f"unknown loader(s) or output(s): {', '.join(sorted((set(names) - set(LOADERS)) | (set(dtypes) - set(DTYPES))))}")
    if not dali_available():
        print("nvidia.dali is not installed: skipping the DALI loaders (pip install 'imgpipe[dali]')")
        names = [n for n in names if "dali" not in n]
    if region_decoder() is None:  # imgpipe-torch already decodes whole images
        names = [n for n in names if n != "imgpipe-torch-whole"]
    cpus = len(os.sched_getaffinity(0))
    workers = worker_counts(a.workers, cpus)
    a.prepare_workers = cpus
    src, rec = prepare(a)
    ffcv = {"beton": str(prepare_ffcv(a, src)), "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)} if a.ffcv_python else {}
    shape = describe_tree(src / "train") if a.data == "imagenet" else "imgpipe synth"
    print(f"data: {len(open_shardset(rec, 'train'))} train JPEGs ({shape}; {src}); batch {a.batch_size}, size {a.image_size}, "
          f"workers {workers}, {cpus} CPUs; {a.epochs} epochs per process, medians of {a.rounds} rounds")  # fmt: skip
    print(f"imgpipe-torch decodes JPEGs: {describe_jpeg_decoder()}")
    loaders = [*names, FFCV] if ffcv else names
    configs = [(n, d, s, w) for s in a.splits for w in workers for d in dtypes for n in loaders if n != FFCV or s == "train"]
    runs: dict[str, list[dict[str, Any]]] = {"|".join(map(str, c)): [] for c in configs}
    decode: list[tuple[float, float]] = []
    for round_ in range(a.rounds):
        decode.append(decode_in_children(rec, 1, 1)[0])
        for name, dtype, split, w in configs if round_ % 2 == 0 else configs[::-1]:  # alternate: a drift lands on both ends alike
            spec = {"loader": name, "dtype": dtype, "split": split, "workers": w, "epochs": a.epochs, "src": str(src), "rec": str(rec),
                    "batch_size": a.batch_size, "image_size": a.image_size, **(ffcv if name == FFCV else {})}  # fmt: skip
            result = in_own_process(spec, a.ffcv_python)
            runs[f"{name}|{dtype}|{split}|{w}"].append(result)
            r = rates(result)
            print(
                f"  round {round_ + 1}: {name:20s} {dtype:7s} {split:5s} {w} workers: "
                f"first {r['first']:6.0f}, steady {r['steady']:6.0f} images/s",
                flush=True,
            )
    figures = report(runs, decode, workers, cpus, a)
    if a.json:
        a.json.write_text(
            json.dumps({"config": {k: str(v) for k, v in vars(a).items()}, "cpus": cpus, **figures}, indent=1, default=float) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
