"""`make demo`: the main job end to end on the embedded synthetic dataset.

synth -> pack -> the same pack from image-net.org-style tars, from timm-style WebDataset shards and as a 3-task
SLURM array job (then --finalize) -> verify -> stage it from a "shared mount" to a "node's disk" and verify the copy
-> info -> one pass over each loader -> a 2-process CPU training run with progressive resizing (48 px, then 64 px;
validated at 80 px with flip TTA), resumed on 1 process for its 64 px epoch -> the shipped recipes -> a bench with
its verdict.
Every step is the real CLI (or the public API for the loaders),
run the way a user would run it; the output lands in ./demo/.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo"
SRC = DEMO / "imagenet"
REC = DEMO / "rec"
TARS = DEMO / "ilsvrc-tars"
REC_FROM_TARS = DEMO / "rec-from-tars"
WDS = DEMO / "imagenet-wds"
REC_FROM_WDS = DEMO / "rec-from-wds"
REC_FROM_ARRAY = DEMO / "rec-from-array"
NODE_LOCAL = DEMO / "node-local" / "rec"  # stands for a training node's own disk; REC stands for the shared mount
SYNTH_ARGS = ("--classes", "8", "--per-class", "40", "--val-per-class", "8", "--seed", "0", "--quirks", "--workers", "2")
PACK_ARGS = ("--shard-size", "2MB", "--workers", "2")


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def imgpipe(*args: str, stdout: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Run one imgpipe command as a user would (with ``env`` added), echoing it first; stop the demo if it fails."""
    cmd = [sys.executable, "-m", "imgpipe", *args]
    shown = "$ " + "".join(f"{k}={v} " for k, v in (env or {}).items()) + "imgpipe " + " ".join(shlex.quote(a) for a in args)
    print(shown + (f" > {stdout}" if stdout else ""), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    if stdout is None:
        result = subprocess.run(cmd, cwd=ROOT, env=env)
    else:
        with open(stdout, "w") as out:
            result = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out)
    if result.returncode != 0:
        sys.exit(f"demo: 'imgpipe {args[0]}' failed with exit code {result.returncode}")


def same_shards(folders: Path, other: Path, what: str) -> None:
    """Say whether the shards packed from ``what`` (in ``other``) are byte for byte those packed from the folders; stop if not."""
    names = sorted(p.name for p in folders.iterdir() if p.suffix in (".rec", ".idx") or p.name.endswith(".labels.npy"))
    same = all((folders / name).read_bytes() == (other / name).read_bytes() for name in names)
    print(f"{len(names)} shard and label files from {what} are {'byte-identical' if same else 'DIFFERENT'} to those from the folders")
    if not same:
        sys.exit(f"demo: packing {what} gave other shards than packing the folders")


def array_task(task: int, count: int) -> dict[str, str]:
    """The variables SLURM gives task ``task`` of ``sbatch --array=0-(count - 1)``."""
    ids = {"ID": task, "COUNT": count, "MIN": 0, "MAX": count - 1, "STEP": 1}
    return {f"SLURM_ARRAY_TASK_{name}": str(value) for name, value in ids.items()}


def loader_pass(backend: str) -> None:
    """One epoch over the train split with a public loader; print its throughput."""
    import imgpipe

    make = imgpipe.make_torch_loader if backend == "torch" else imgpipe.make_dali_loader
    loader = make(REC, "train", batch_size=32, image_size=128, workers=2, seed=0)
    start = time.perf_counter()
    images = 0
    for batch, _labels in loader:
        images += len(batch)
    elapsed = time.perf_counter() - start
    print(f"{backend:5s} loader: {len(loader)} batches of {tuple(batch.shape)} {batch.dtype}, {images / elapsed:,.0f} images/s")
    if backend == "torch":
        from imgpipe.loaders.pixels import describe_jpeg_decoder

        print(f"      JPEGs decoded: {describe_jpeg_decoder()}")


def main() -> None:
    start = time.perf_counter()
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()

    step("1. make an ImageNet-shaped synthetic dataset (with a few broken files, on purpose)")
    imgpipe("synth", str(SRC), *SYNTH_ARGS)

    step("2. pack it into RecordIO shards")
    imgpipe("pack", str(SRC), str(REC), *PACK_ARGS)

    step("2b. the same images as image-net.org ships them (train tar, val tar, devkit), packed in place")
    imgpipe("synth", str(TARS), *SYNTH_ARGS, "--tars", "--from", str(SRC))  # step 1's tree, written as tars
    imgpipe("pack", str(TARS), str(REC_FROM_TARS), *PACK_ARGS)
    same_shards(REC, REC_FROM_TARS, "the tars")

    step("2c. the same images as timm ships ImageNet (WebDataset shards of .jpg, .cls, .json), packed in place")
    imgpipe("synth", str(WDS), *SYNTH_ARGS, "--layout", "wds", "--from", str(SRC))  # written from step 1's tree, not made again
    imgpipe("pack", str(WDS), str(REC_FROM_WDS), *PACK_ARGS)
    same_shards(REC, REC_FROM_WDS, "the WebDataset shards")

    step("2d. the same pack split over 3 machines as a SLURM array job (sbatch --array=0-2), then --finalize")
    for task in range(3):  # each task of the array, here one after the other on this machine
        imgpipe("pack", str(SRC), str(REC_FROM_ARRAY), *PACK_ARGS, "--no-progress", env=array_task(task, 3))
    imgpipe("pack", str(SRC), str(REC_FROM_ARRAY), *PACK_ARGS, "--finalize")
    same_shards(REC, REC_FROM_ARRAY, "the array job's 3 parts")

    step("3. verify the shards are intact and complete")
    imgpipe("verify", str(REC), "--decode")

    step("3b. copy it from the shared mount (here: rec/) to a node's local disk, every file checked, then verify the copy")
    imgpipe("stage", str(REC), str(NODE_LOCAL))
    imgpipe("verify", str(NODE_LOCAL))

    step("4. what the dataset holds")
    imgpipe("info", str(REC))

    step("5. one pass over each loader")
    loader_pass("torch")
    from imgpipe.loaders.dali import dali_available

    if dali_available():
        loader_pass("dali")
    else:
        print("dali  loader: skipped (install it with: pip install 'imgpipe[dali]')")

    step("6. a short 2-process CPU training run (DDP over gloo), progressive resizing: epoch 0 at 48 px, epoch 1 at 64 px")
    config = DEMO / "train.yaml"
    imgpipe("train", "--print-config", stdout=config)  # the defaults a user starts from
    imgpipe(
        "train",
        "--config",
        str(config),
        "--gpus",
        "0",
        "--nproc",
        "2",
        "--set",
        f"data.path={REC}",
        "--set",
        f"output.dir={DEMO / 'run'}",
        "--set",
        "model.name=resnet18",
        "--set",
        "data.resolution=[48, 64]",
        "--set",
        "data.val_image_size=80",
        "--set",
        "data.val_flip_tta=true",
        "--set",
        "train.epochs=1",
        "--set",
        "train.batch_size=16",
    )

    step("6b. resume that run on 1 process: the same global batch (32), so the same data stream, one more epoch, at 64 px")
    imgpipe(
        "train",
        "--config",
        str(DEMO / "run" / "config.yaml"),  # the resolved config the run saved
        "--gpus",
        "0",
        "--set",
        "train.epochs=2",
        "--resume",
    )

    step("6c. the recipes shipped with imgpipe (FFCV's hyperparameters): imgpipe train --recipe NAME --set data.path=...")
    imgpipe("train", "--list-recipes")

    step("7. find the bottleneck")
    imgpipe(
        "bench", str(REC), "--gpus", "0", "--nproc", "2", "--steps", "8", "--batch-size", "16", "--workers", "1,2", "--compute-ms", "40"
    )

    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s; outputs in {DEMO}")


if __name__ == "__main__":
    main()
