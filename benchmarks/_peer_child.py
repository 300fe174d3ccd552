"""Mosaic Streaming 0.13.0 and LitData 0.2.76 reading train batches from an S3 bucket, run by the
interpreter of their own venv (``benchmarks/peers_env.sh``); it imports no imgpipe module.

    python _peer_child.py write SPEC   # the peer's shards of SPEC's train tree (made once, locally), uploaded to SPEC's bucket
    python _peer_child.py run SPEC     # ``_measure.run_epochs`` over the peer's loader from the bucket; prints JSON

Shards hold each JPEG's bytes as they are (no re-encoding): Mosaic as an MDS ``bytes`` column
(``MDSWriter``), LitData as a ``bytes`` item (``BinaryWriter``, what ``litdata.optimize`` writes
with), both of ``shard_mb`` MB at most, in one seeded shuffled order (as ``imgpipe pack`` shuffles).
A train sample is the same for both peers: torchvision's ``decode_jpeg`` (libjpeg-turbo, whole
image, RGB), torchvision's ``RandomResizedCrop`` box (0.08-1, 3/4-4/3), torch's bilinear
antialiased uint8 resize to ``image_size`` (the kernel imgpipe's torch loader resizes with), a
horizontal flip half the time; contiguous uint8 NCHW batches, the last partial batch dropped.
Each peer runs in a torch ``DataLoader`` (LitData: its ``StreamingDataLoader``) with ``workers``
persistent workers, shuffled, its cache in an empty ``cache_dir``: the first epoch is cold,
the next ones read what the first one cached.

LitData 0.2.76 builds its obstore client without ``allow_http``, so it cannot reach an ``http://``
endpoint as shipped: for one, this script adds ``allow_http`` to LitData's obstore client options
and says so in its output (``notes``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import numpy as np
import torch
import torch.nn.functional as F
from _measure import run_epochs  # benchmarks/ is on sys.path when run as a script
from _s3_server import fetch_counts

PEERS = ("mosaic", "litdata")
TRAIN_SCALE, TRAIN_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


# ----------------------------------------------------------------------------- shards


def source_items(train: Path, seed: int) -> list[tuple[Path, int]]:
    """A class-folder tree's (JPEG path, class index in ImageFolder order), in a seeded shuffled order."""
    classes = sorted(p for p in train.iterdir() if p.is_dir())
    items = [(path, label) for label, folder in enumerate(classes) for path in sorted(folder.iterdir()) if path.is_file()]
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in order]


def write_mosaic(items: list[tuple[Path, int]], out: Path, shard_bytes: int) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"}, size_limit=shard_bytes) as writer:
        for path, label in items:
            writer.write({"image": path.read_bytes(), "label": label})


def write_litdata(items: list[tuple[Path, int]], out: Path, shard_bytes: int) -> None:
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(out), chunk_bytes=shard_bytes)
    for index, (path, label) in enumerate(items):
        writer[index] = {"image": path.read_bytes(), "label": label}
    writer.done()
    writer.merge()  # the one index.json a StreamingDataset reads


WRITERS = {"mosaic": write_mosaic, "litdata": write_litdata}


def make_shards(spec: dict[str, Any]) -> Path:
    """``spec["shards"]``: the peer's shards of ``spec["train"]``, made once (via a temporary name)."""
    out = Path(spec["shards"])
    if not out.is_dir():
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        WRITERS[spec["peer"]](source_items(Path(spec["train"]), spec["seed"]), partial, spec["shard_mb"] * 10**6)
        os.replace(partial, out)
    return out


def upload(local: Path, url: str) -> dict[str, int]:
    """Every file under ``local`` to ``url`` (``s3://bucket/prefix``), with boto3's transfer defaults;
    the bucket is made if missing."""
    import boto3

    parsed = urlparse(url)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    s3 = boto3.client("s3")
    if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=bucket)
    files = sorted(p for p in local.rglob("*") if p.is_file())
    for path in files:
        s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


# ----------------------------------------------------------------------------- loaders


def train_sample(jpeg: bytes, size: int) -> torch.Tensor:
    """One JPEG as a ``size`` x ``size`` uint8 CHW train sample: whole decode, random resized crop, flip."""
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import RandomResizedCrop

    pixels = decode_jpeg(torch.frombuffer(bytearray(jpeg), dtype=torch.uint8), mode=ImageReadMode.RGB)
    top, left, height, width = RandomResizedCrop.get_params(pixels, list(TRAIN_SCALE), list(TRAIN_RATIO))
    box = pixels[:, top : top + height, left : left + width].unsqueeze(0).contiguous(memory_format=torch.channels_last)
    out = F.interpolate(box, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    if torch.rand(()) < 0.5:
        out = out.flip(-1)
    return out.contiguous()


def mosaic_loader(spec: dict[str, Any]) -> Any:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    size = spec["image_size"]

    class MosaicTrain(StreamingDataset):
        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            sample = super().__getitem__(index)
            return train_sample(sample["image"], size), sample["label"]

    dataset = MosaicTrain(
        remote=spec["url"], local=spec["cache_dir"], shuffle=True, shuffle_seed=spec["seed"], batch_size=spec["batch_size"]
    )
    return torch.utils.data.DataLoader(
        dataset, batch_size=spec["batch_size"], num_workers=spec["workers"], drop_last=True, persistent_workers=spec["workers"] > 0
    )


def allow_http_for_litdata() -> None:
    """Add ``allow_http`` to the obstore client options LitData builds its S3 stores with."""
    import litdata.streaming.downloader as downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}


def litdata_loader(spec: dict[str, Any]) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    size = spec["image_size"]
    dataset = StreamingDataset(
        spec["url"], cache_dir=spec["cache_dir"], shuffle=True, seed=spec["seed"],
        transform=lambda item: (train_sample(item["image"], size), item["label"]),
    )  # fmt: skip
    return StreamingDataLoader(
        dataset, batch_size=spec["batch_size"], num_workers=spec["workers"], drop_last=True, persistent_workers=spec["workers"] > 0
    )


LOADERS: dict[str, Callable[[dict[str, Any]], Any]] = {"mosaic": mosaic_loader, "litdata": litdata_loader}


def configure_environment(spec: dict[str, Any]) -> list[str]:
    """Point both libraries at ``spec["endpoint"]`` through their standard variables; the notes to print."""
    os.environ["AWS_ENDPOINT_URL"] = os.environ["S3_ENDPOINT_URL"] = spec["endpoint"]  # boto3's; Mosaic's own
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(name, value)
    os.environ["LITDATA_DISABLE_VERSION_CHECK"] = "1"  # LitData's StreamingDataset asks PyPI for a newer release otherwise
    notes = []
    if spec.get("peer") == "litdata" and spec["endpoint"].startswith("http://"):
        allow_http_for_litdata()
        notes.append(
            "litdata: allow_http added to its obstore client options (0.2.76 leaves it out, so an http:// endpoint fails as shipped)"
        )
    return notes


def cache_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run(spec: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The peer's epochs from the bucket, each with what the server answered and what the cache gained during it."""
    import litdata
    import streaming

    torch.set_num_threads(1)  # as loaders.run_child: the loader's work is its workers'
    cache = Path(spec["cache_dir"])
    if cache.exists() and any(cache.iterdir()):
        raise SystemExit(f"{cache} is not empty: a cold first epoch needs an empty cache")
    cache.mkdir(parents=True, exist_ok=True)

    def counters() -> dict[str, int]:
        return {**fetch_counts(spec["endpoint"]), "cache_bytes": cache_bytes(cache)}

    result = run_epochs(lambda: LOADERS[spec["peer"]](spec), spec["epochs"], torch.uint8, counters)
    for epoch in result["epochs"]:
        epoch["images_per_s"] = epoch["images"] / epoch["wall_s"]
    versions = {"mosaic": f"mosaicml-streaming {streaming.__version__}", "litdata": f"litdata {litdata.__version__}"}
    decode = "torchvision.io.decode_jpeg (whole image) + RandomResizedCrop box + torch bilinear antialiased uint8 resize + flip"
    return {"peer": spec["peer"], "library": versions[spec["peer"]], "decode": decode, "notes": notes, **result}


def main(argv: list[str]) -> int:
    command, spec = argv[0], json.loads(argv[1])
    notes = configure_environment(spec)
    if command == "write":
        began = time.perf_counter()
        shards = make_shards(spec)
        made = time.perf_counter()
        uploaded = upload(shards, spec["url"])
        print(
            json.dumps(
                {"peer": spec["peer"], "shards": str(shards), "convert_s": made - began, "upload_s": time.perf_counter() - made, **uploaded}
            )
        )
        return 0
    print(json.dumps(run(spec, notes)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
