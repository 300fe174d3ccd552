"""Where one train sample's time goes in the torch loader, phase by phase, against Pillow's whole decode.

One process, one thread, the same records: for each, the phases of ``imgpipe.loaders.pixels``'
train path (read the record without a copy, JPEG header, crop draw, region decode, resize, store
into a batch slot, normalize to float32), then the whole path as the workers run it
(``decode_sample``), Pillow's whole decode (the per-core reference of ``loaders.py``) and the
region decoder asked for the whole image. Records whose crop shrinks 2x or more take the reduced
(DCT-scaled) path and are timed only as part of ``decode_sample``. Prints microseconds per image,
the median of ``--passes`` passes.

    python benchmarks/decode_phases.py                  # the ImageNet-shaped pack loaders.py made
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from imgpipe.format.shardset import open_shardset
from imgpipe.image.jpeg import jpeg_size
from imgpipe.loaders import pixels
from imgpipe.loaders.geometry import TrainGeometry, sample_crop
from imgpipe.loaders.torch import normalization

PHASES = ("read", "header", "crop draw", "region decode", "resize", "store uint8", "normalize float32")


def one_pass(shards, count: int, size: int) -> tuple[dict[str, float], int]:
    """(seconds per image, phase by phase, the records the phases were timed on): over the first ``count`` records,
    the phases only over those whose crop does not take the reduced path (none of them where every crop does)."""
    geometry = TrainGeometry(image_size=size)
    decode = pixels.region_decoder()
    scale, bias = normalization(torch.device("cpu"))
    slot, slot_float = torch.empty((3, size, size), dtype=torch.uint8), torch.empty((3, size, size))
    total = dict.fromkeys(PHASES, 0.0)
    timed = 0
    for i in range(count):
        t0 = time.perf_counter()
        _, payload = shards.read_view(i)
        t1 = time.perf_counter()
        width, height = jpeg_size(payload)
        t2 = time.perf_counter()
        crop = sample_crop(geometry, width, height, seed=0, epoch=1, index=i)
        t3 = time.perf_counter()
        if pixels.reduces_in_dct(crop, size):
            continue
        left, top, w, h = (int(v) for v in crop[:4])
        region = decode(payload, left, top, w, h, 1)
        t4 = time.perf_counter()
        resized = pixels.resize(pixels.hwc_tensor(region, h, w), size, size)
        t5 = time.perf_counter()
        slot.copy_(resized.flip(-1) if crop.flip else resized)
        t6 = time.perf_counter()
        slot_float.copy_(slot).mul_(scale).add_(bias)
        t7 = time.perf_counter()
        for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)):
            total[phase] += seconds
        timed += 1
    per_image = {phase: seconds / timed for phase, seconds in total.items()} if timed else {}
    payloads = [shards.read_view(i)[1] for i in range(count)]
    start = time.perf_counter()
    for i, payload in enumerate(payloads):
        slot.copy_(pixels.decode_sample(payload, lambda w, h: sample_crop(geometry, w, h, seed=0, epoch=1, index=i), size))  # noqa: B023
    per_image["decode_sample (all records)"] = (time.perf_counter() - start) / count
    start = time.perf_counter()
    for payload in payloads:
        Image.open(io.BytesIO(payload)).convert("RGB").load()
    per_image["Pillow whole decode"] = (time.perf_counter() - start) / count
    start = time.perf_counter()
    for payload in payloads:
        decode(payload, 0, 0, *jpeg_size(payload), 1)
    per_image["region decoder, whole image"] = (time.perf_counter() - start) / count
    return per_image, timed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rec", type=Path, default=Path(tempfile.gettempdir()) / "imgpipe-bench-loaders" / "rec-imagenet-shaped-3000",
                   help="a packed folder (default: the one benchmarks/loaders.py packs)")  # fmt: skip
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--image-size", type=int, default=224)
    a = p.parse_args(argv)
    if pixels.region_decoder() is None:
        sys.exit("imgpipe's region decoder is not built here: nothing to break down")
    if not a.rec.is_dir():
        sys.exit(f"{a.rec} does not exist: run benchmarks/loaders.py once (it packs the data), or pass --rec")
    torch.set_num_threads(1)
    shards = open_shardset(a.rec, "train")
    count = min(a.images, len(shards))
    passes, timed = zip(*(one_pass(shards, count, a.image_size) for _ in range(a.passes)))
    print(f"{count} train records of {a.rec}, {a.image_size} px, one thread; microseconds per image, median of {a.passes} passes")
    print(f"  the phases: over the {timed[0]} records whose crop is decoded whole (the others take the reduced path)")
    for phase in passes[0]:
        print(f"  {phase:30s} {statistics.median(p[phase] for p in passes) * 1e6:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
