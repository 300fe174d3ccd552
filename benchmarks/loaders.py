"""Loader throughput on one synthetic dataset: imgpipe torch vs torchvision vs DALI CPU vs imgpipe DALI.

Every loader gets the same data (``imgpipe.synth`` JPEGs, packed with ``imgpipe.pack``; the
torchvision baseline reads the source tree), the same transforms (train: RandomResizedCrop
0.08-1, 3/4-4/3 + flip; val: resize shorter side to size/0.875 + center crop; float32 NCHW
normalized with ImageNet mean/std), the same batch size and the same worker / thread count.
``imgpipe-torch-whole`` is imgpipe's torch loader as an install without its region decoder
runs it (torchvision decodes whole JPEGs): the ratio between the two is what that decoder brings.
``imgpipe-dali`` (imgpipe's sampler and crops fed to DALI's slice decoder) is measured against
``dali-plain`` (``readers.mxnet`` and DALI's own random crop, the same decode/resize work).

Each split runs ``repeats + 1`` rounds, and each round one epoch of every loader in turn; the
first round is a warm-up (worker start, pipeline build, page cache) and the figures are medians
over the others. This machine's speed drifts by 20-30 % over minutes, so every ratio is taken
within a round and the median of the rounds' ratios is reported (and judged against the goals).
Besides wall-clock images/s, each epoch reports images per CPU-second (this process, its
threads and its workers): on a shared machine that is the steadier measure of efficiency.
Per-worker memory is sampled after every epoch (persistent workers; torch-based loaders only:
DALI uses threads): RSS, and the private part (pages not shared with the parent), which is
what copy-on-read growth shows in; the main process's private memory is sampled too (it
receives and normalizes every batch; with every loader alive in the round-robin it also holds
the DALI pipelines' buffers, which grow round after round, so compare it with --only). The
decode-only limit decodes every train JPEG once with Pillow in one process (one core), and in
as many processes at once as the loaders get workers (what the cores decode together); for the
per-core goal a decode-only pass also runs just before each imgpipe-torch train epoch.

    python benchmarks/loaders.py --quick --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from PIL import Image

import imgpipe
from imgpipe.loaders.pixels import describe_jpeg_decoder, region_decoder
from imgpipe.format.manifest import manifest_path
from imgpipe.format.dali_index import write_dali_index
from imgpipe.format.shardset import open_shards
from imgpipe.loaders.geometry import IMAGENET_MEAN, IMAGENET_STD, EvalGeometry

LOADERS = ("imgpipe-torch", "imgpipe-torch-whole", "torchvision", "dali-plain", "imgpipe-dali")
TORCH_BASED = ("imgpipe-torch", "imgpipe-torch-whole", "torchvision")
SETTLE_S = 0.5  # rest after each epoch, before the next loader's


# ----------------------------------------------------------------------------- data


def prepare(work: Path, classes: int, per_class: int, val_per_class: int, workers: int) -> tuple[Path, Path]:
    """The synthetic source tree and its pack under ``work`` (reused when already there)."""
    from imgpipe.synth import make_synthetic

    src, rec = work / f"src-{classes}x{per_class}", work / f"rec-{classes}x{per_class}"
    if not (src / "LOC_val_solution.csv").is_file():
        make_synthetic(src, classes=classes, per_class=per_class, val_per_class=val_per_class, seed=0, progress=False)
    if not manifest_path(rec).is_file():
        imgpipe.pack(src, rec, workers=workers, overwrite=True, progress=False)
    return src, rec


# ----------------------------------------------------------------------------- loaders


def imgpipe_torch(rec: Path, train: bool, a: argparse.Namespace) -> Any:
    return imgpipe.make_torch_loader(rec, "train" if train else "val", batch_size=a.batch_size, train=train, image_size=a.image_size, workers=a.workers)


@contextlib.contextmanager
def whole_decode() -> Iterator[None]:
    """imgpipe's torch loader as an install without the region decoder runs it (workers forked inside inherit it)."""
    from imgpipe.loaders import pixels

    built = pixels.region_decoder
    pixels.region_decoder = lambda: None
    try:
        yield
    finally:
        pixels.region_decoder = built


class WholeDecodeTorch:
    """imgpipe's torch loader decoding whole JPEGs with torchvision: what the region decoder brings, in the same run."""

    def __init__(self, rec: Path, train: bool, a: argparse.Namespace) -> None:
        with whole_decode():
            self.loader = imgpipe_torch(rec, train, a)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        with whole_decode():
            yield from self.loader


def imgpipe_dali(rec: Path, train: bool, a: argparse.Namespace) -> Any:
    return imgpipe.make_dali_loader(rec, "train" if train else "val", batch_size=a.batch_size, train=train, image_size=a.image_size, workers=a.workers)


def torchvision_baseline(src: Path, train: bool, a: argparse.Namespace) -> Any:
    """ImageFolder (train) or the flat val folder + its CSV labels, PIL transforms, a plain DataLoader."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import default_loader

    from imgpipe.packing.source import scan

    normalize = T.Normalize([m / 255 for m in IMAGENET_MEAN], [s / 255 for s in IMAGENET_STD])
    if train:
        tf = T.Compose([T.RandomResizedCrop(a.image_size), T.RandomHorizontalFlip(), T.ToTensor(), normalize])
        dataset: Any = ImageFolder(str(src / "train"), transform=tf)
    else:
        tf = T.Compose([T.Resize(EvalGeometry(image_size=a.image_size).resize_shorter), T.CenterCrop(a.image_size), T.ToTensor(), normalize])
        items = scan(src, ["val"]).splits["val"]
        samples = [(str(src / p), int(label)) for p, label in zip(items.paths, items.labels)]

        class ValFolder(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return len(samples)

            def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
                path, label = samples[i]
                return tf(default_loader(path)), label

        dataset = ValFolder()
    return torch.utils.data.DataLoader(
        dataset, batch_size=a.batch_size, shuffle=train, drop_last=train, num_workers=a.workers, persistent_workers=a.workers > 0
    )


class PlainDali:
    """The textbook DALI CPU pipeline: readers.mxnet -> image_random_crop / resize -> crop_mirror_normalize."""

    def __init__(self, rec: Path, train: bool, a: argparse.Namespace) -> None:
        from nvidia.dali import Pipeline, fn, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        shards = open_shards(rec, "train" if train else "val")
        size = a.image_size
        pipe = Pipeline(batch_size=a.batch_size, num_threads=a.workers, device_id=None, seed=0)
        with pipe:
            jpegs, labels = fn.readers.mxnet(
                path=[str(p) for p in shards.rec_paths], index_path=[str(write_dali_index(shards))],
                random_shuffle=train, pad_last_batch=not train, name="Reader",
            )
            if train:
                images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_x=size, resize_y=size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=EvalGeometry(image_size=size).resize_shorter)
                mirror = 0
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="CHW", crop=(size, size), mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD), mirror=mirror
            )
            pipe.set_outputs(images, labels)
        policy = LastBatchPolicy.DROP if train else LastBatchPolicy.PARTIAL
        self._it = DALIGenericIterator([pipe], ["images", "labels"], reader_name="Reader", last_batch_policy=policy)

    def __len__(self) -> int:
        return len(self._it)

    def __iter__(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        for (out,) in self._it:
            yield out["images"], out["labels"].reshape(-1).long()


# ----------------------------------------------------------------------------- measuring


def child_pids() -> list[int]:
    """The live child processes of this one: the DataLoader workers."""
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, private) MB of a process; private = its own pages, not the ones shared with the parent."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0, 0.0
    fields = {line.split(":")[0]: int(line.split()[1]) for line in rollup.splitlines()[1:] if line.endswith("kB")}
    return fields.get("Rss", 0) / 1024, (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / 1024


def cpu_seconds() -> float:
    """CPU time of this process (all threads), its live children and its reaped children."""
    own, gone = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + gone.ru_utime + gone.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in child_pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def one_epoch(loader: Any) -> tuple[int, float, float]:
    """(images, wall seconds, CPU seconds) of one pass."""
    start, cpu, images = time.perf_counter(), cpu_seconds(), 0
    for batch, labels in loader:
        images += int(labels.numel())
        assert batch.dtype == torch.float32 and batch.shape[0] == labels.shape[0]
    return images, time.perf_counter() - start, cpu_seconds() - cpu


def decode_all(payloads: list[bytes]) -> None:
    """Decode every payload once with Pillow."""
    for payload in payloads:
        Image.open(io.BytesIO(payload)).convert("RGB").load()


def decode_in_child(rec: Path, repeats: int, start: Any, results: Any) -> None:
    """(Forked child) read every train JPEG, wait for ``start``, decode them ``repeats`` times; send
    (images/s, images per CPU-second) of each pass through ``results``."""
    shards = open_shards(rec, "train")
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


def decode_only(rec: Path, repeats: int, processes: int) -> dict[str, float]:
    """The decode-only limit: every train JPEG decoded once with Pillow in one process (images/s,
    images per CPU-second), and in ``processes`` processes at once (images/s: what this machine's
    cores decode together, which is less than ``processes`` times one core where cores share
    caches, memory bandwidth or a hypervisor's time)."""
    one = decode_in_children(rec, 1, repeats)
    parallel = decode_in_children(rec, processes, repeats)
    return {
        "images_per_s": statistics.median(rate for rate, _ in one),
        "images_per_cpu_s": statistics.median(per_cpu for _, per_cpu in one),
        "processes": processes,
        "parallel_images_per_s": processes * statistics.median(rate for rate, _ in parallel),
    }


def decode_pass(rec: Path) -> float:
    """One single-process decode-only pass (images/s), to pair with a loader epoch."""
    return decode_in_children(rec, 1, 1)[0][0]


def measure_split(
    names: list[str], makers: dict[str, Callable[[bool], Any]], train: bool, a: argparse.Namespace, paired: dict[str, Callable[[], float]]
) -> dict[str, dict[str, Any]]:
    """``repeats + 1`` rounds of one epoch of each loader in turn; medians after the warm-up round.

    Round-robin, so that this machine's drift (its speed wanders by 20-30 % over minutes) lands
    on every loader alike: ratios between loaders are taken within a round (``round_ratios``).
    Each epoch is followed by ``SETTLE_S`` of rest: DALI keeps computing its prefetched batches
    after an epoch ends, and that work must not land in the next loader's epoch. A loader named
    in ``paired`` runs that measurement (a decode-only pass) just before each of its epochs.
    """
    split = "train" if train else "val"
    runs: dict[str, dict[str, list[Any]]] = {name: {"rate": [], "per_cpu": [], "rss": [], "private": [], "main": [], "paired": []} for name in names}
    workers: dict[str, set[int]] = {name: set() for name in names}
    loaders = {name: makers[name](train) for name in names}
    for _ in range(a.repeats + 1):
        for name, loader in loaders.items():
            if name in paired:
                runs[name]["paired"].append(paired[name]())
            before = set(child_pids())
            images, wall, cpu = one_epoch(loader)
            runs[name]["rate"].append(images / wall)
            runs[name]["per_cpu"].append(images / max(cpu, 1e-9))
            if name in TORCH_BASED:
                if not workers[name]:  # its workers: the children that appeared during its first epoch
                    workers[name] = set(child_pids()) - before
                sizes = [memory_mb(pid) for pid in sorted(workers[name])]
                runs[name]["rss"].append(max((r for r, _ in sizes), default=0.0))
                runs[name]["private"].append(max((p for _, p in sizes), default=0.0))
                runs[name]["main"].append(memory_mb(os.getpid())[1])
            time.sleep(SETTLE_S)
    for loader in loaders.values():
        getattr(loader, "close", lambda: None)()  # stop persistent workers before the next split starts its own
    loaders.clear()
    out = {}
    for name, run in runs.items():
        out[name] = {
            "images_per_s": statistics.median(run["rate"][1:]),
            "images_per_cpu_s": statistics.median(run["per_cpu"][1:]),
            "epochs_images_per_s": [round(r, 1) for r in run["rate"]],
            "worker_rss_mb": [round(r, 1) for r in run["rss"]],
            "worker_private_mb": [round(r, 1) for r in run["private"]],
            "main_private_mb": [round(r, 1) for r in run["main"]],
        }
        if run["paired"]:
            out[name]["paired_images_per_s"] = [round(r, 1) for r in run["paired"]]
        mem = f"  worker MB after each epoch: RSS {out[name]['worker_rss_mb']} private {out[name]['worker_private_mb']}; main process private {out[name]['main_private_mb']}" if run["rss"] else ""
        print(f"  {name:14s} {split:5s} {out[name]['images_per_s']:7.1f} images/s {out[name]['images_per_cpu_s']:7.1f} images/CPU-s"
              f"  epochs {out[name]['epochs_images_per_s']}{mem}", flush=True)
    return out


def round_ratios(figures: dict[str, Any], split: str, mine: str, theirs: str) -> list[float]:
    """``mine``'s images/s over ``theirs``, round by round, after the warm-up round."""
    ours, other = figures[split][mine]["epochs_images_per_s"][1:], figures[split][theirs]["epochs_images_per_s"][1:]
    return [m / t for m, t in zip(ours, other)]


def report_ratio(figures: dict[str, Any], key: str, split: str, mine: str, theirs: str, goal: float | None, note: str = "") -> None:
    """Print the median of ``round_ratios`` (and the ratio of images per CPU-second), with the goal's verdict;
    record them as ``figures[key + "_" + split]``."""
    rounds = round_ratios(figures, split, mine, theirs)
    wall = statistics.median(rounds)
    eff = figures[split][mine]["images_per_cpu_s"] / figures[split][theirs]["images_per_cpu_s"]
    verdict = f"goal >= {goal}x: {'PASS' if wall >= goal else 'MISS'}  " if goal is not None else ""
    print(f"  {mine} / {theirs:19s} {split:5s} {wall:5.2f}x ({eff:5.2f}x per CPU-s)  {verdict}rounds {', '.join(f'{r:.2f}' for r in rounds)}  {note}".rstrip())
    figures[f"{key}_{split}"] = {"wall": wall, "rounds": rounds, "per_cpu": eff}


# ----------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="10 classes x 40 train, 10 val each, 3 repeats")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench-loaders", help="data folder (reused between runs)")
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--val-per-class", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=min(8, len(os.sched_getaffinity(0))), help="DataLoader workers = DALI threads")
    p.add_argument("--repeats", type=int, default=3, help="measured epochs per loader and split (after one warm-up)")
    p.add_argument("--only", default=",".join(LOADERS), help=f"comma-separated subset of {', '.join(LOADERS)}")
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args(argv)
    if a.quick:
        a.classes, a.per_class, a.val_per_class = 10, 40, 10
    a.repeats = max(1, a.repeats)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    torch.set_num_threads(1)
    from imgpipe.loaders.dali import dali_available

    names = [n.strip() for n in a.only.split(",") if n.strip()]
    unknown = set(names) - set(LOADERS)
    if unknown:
        sys.exit(f"unknown loader(s): {', '.join(sorted(unknown))}")
    if not dali_available():
        print("nvidia.dali is not installed: skipping the DALI loaders (pip install 'imgpipe[dali]')")
        names = [n for n in names if "dali" not in n]
    if region_decoder() is None:  # imgpipe-torch already decodes whole images
        names = [n for n in names if n != "imgpipe-torch-whole"]
    src, rec = prepare(a.work, a.classes, a.per_class, a.val_per_class, a.workers)
    cpus = len(os.sched_getaffinity(0))
    print(f"data: {len(open_shards(rec, 'train'))} train / {len(open_shards(rec, 'val'))} val JPEGs ({src}); "
          f"batch {a.batch_size}, size {a.image_size}, {a.workers} workers/threads, {cpus} CPUs, medians of {a.repeats} epochs")
    print(f"imgpipe-torch decodes JPEGs: {describe_jpeg_decoder()}")

    makers: dict[str, Callable[[bool], Any]] = {
        "imgpipe-torch": lambda train: imgpipe_torch(rec, train, a),
        "imgpipe-torch-whole": lambda train: WholeDecodeTorch(rec, train, a),
        "torchvision": lambda train: torchvision_baseline(src, train, a),
        "dali-plain": lambda train: PlainDali(rec, train, a),
        "imgpipe-dali": lambda train: imgpipe_dali(rec, train, a),
    }
    figures: dict[str, Any] = {"config": {k: str(v) for k, v in vars(a).items()}, "cpus": cpus, "jpeg_decoder": describe_jpeg_decoder()}
    figures["decode_only"] = d = decode_only(rec, a.repeats, min(a.workers, cpus))
    print(f"  {'decode-only':14s} train {d['images_per_s']:7.1f} images/s {d['images_per_cpu_s']:7.1f} images/CPU-s (Pillow, one process); "
          f"{d['parallel_images_per_s']:.1f} images/s in {d['processes']} processes at once "
          f"({d['parallel_images_per_s'] / d['images_per_s'] / d['processes']:.2f}x one process per process)")
    per_core_pairs = {"imgpipe-torch": lambda: decode_pass(rec)}
    for split, train in (("train", True), ("val", False)):
        figures[split] = measure_split(names, makers, train, a, per_core_pairs if train else {})

    print("\nratios: medians of the rounds' ratios of wall images/s (CPU-efficiency: ratio of images per CPU-second); goals from issues 3 and 12")
    ours = figures["train"].get("imgpipe-torch")
    for other, goal in (("torchvision", 2.0), ("dali-plain", 1.0)):
        if ours is None or other not in figures["train"]:
            continue
        for split in ("train", "val"):
            report_ratio(figures, f"ratio_vs_{other}", split, "imgpipe-torch", other, goal if split == "train" else None)
    if ours is not None:
        cores = min(a.workers, cpus)
        pairs = [rate / cores / decode for rate, decode in zip(ours["epochs_images_per_s"][1:], ours["paired_images_per_s"][1:])]
        paired = statistics.median(pairs)
        per_cpu = ours["images_per_cpu_s"] / d["images_per_cpu_s"]
        parallel = ours["images_per_s"] / d["parallel_images_per_s"]
        figures["ratio_per_core_vs_decode_only"] = {"paired": paired, "rounds": pairs, "per_cpu": per_cpu, "vs_parallel_decode_only": parallel}
        print(f"  imgpipe-torch per core / decode-only      train {paired:5.2f}x ({per_cpu:5.2f}x per CPU-s)  goal >= 0.8x: "
              f"{'PASS' if paired >= 0.8 else 'MISS'}  rounds {', '.join(f'{p:.2f}' for p in pairs)} (decode-only pass just before each epoch)")
        print(f"  imgpipe-torch / decode-only in {d['processes']} processes train {parallel:5.2f}x")
    if ours is not None and "imgpipe-torch-whole" in figures["train"]:
        for split in ("train", "val"):
            report_ratio(figures, "ratio_vs_whole_decode", split, "imgpipe-torch", "imgpipe-torch-whole", None, "what the region decoder brings")
    if "imgpipe-dali" in figures["train"] and "dali-plain" in figures["train"]:
        for split in ("train", "val"):
            report_ratio(figures, "ratio_imgpipe-dali_vs_dali-plain", split, "imgpipe-dali", "dali-plain", 0.95, "same work; issue 12's goal")
    if a.json:
        a.json.write_text(json.dumps(figures, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
