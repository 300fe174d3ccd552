"""FFCV 1.0.2's ``Loader`` as ``loaders.py``'s ``ffcv`` row, run by the interpreter of FFCV's own venv
(``benchmarks/ffcv_env.sh``); it imports no imgpipe module, which that venv does not have.

    python _ffcv_child.py write SPEC   # the .beton of SPEC's train tree, made once: every JPEG decoded and re-encoded at quality 90
    python _ffcv_child.py run SPEC     # ``loaders.run_child``'s epochs with FFCV's Loader; prints the same JSON

The train pipeline: ``RandomResizedCropRGBImageDecoder`` (0.08-1, 3/4-4/3; OpenCV's area resize),
``RandomHorizontalFlip``, for float32 ``NormalizeImage`` (ImageNet mean/std in 0-255 units, on the
CPU in FFCV's threads, so before ``ToTensor``), ``ToTensor``, ``ToTorchImage(channels_last=False)``:
contiguous NCHW like the other rows. ``num_workers`` threads, random order, page-cached (``os_cache``),
last partial batch dropped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _measure import run_epochs  # benchmarks/ is on sys.path when run as a script
from PIL import Image

JPEG_QUALITY = 90  # FFCV's default, and its ImageNet example's


class SourceImages:
    """A class-folder tree (``train/<class>/*``) as FFCV's writer reads it: (RGB array, class index)."""

    def __init__(self, train: Path) -> None:
        classes = sorted(p for p in train.iterdir() if p.is_dir())
        self.items = [(path, label) for label, folder in enumerate(classes) for path in sorted(folder.iterdir()) if path.is_file()]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        path, label = self.items[i]
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB")), label


def write_beton(spec: dict[str, Any]) -> None:
    """Write ``spec["beton"]`` from ``spec["train"]`` (via a temporary name, so a killed write leaves none)."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    beton, partial = Path(spec["beton"]), Path(spec["beton"] + ".partial")
    fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=JPEG_QUALITY), "label": IntField()}
    DatasetWriter(str(partial), fields, num_workers=spec["workers"]).from_indexed_dataset(SourceImages(Path(spec["train"])))
    os.replace(partial, beton)


def make_loader(spec: dict[str, Any]) -> Any:
    """FFCV's train loader over ``spec["beton"]``, with ``spec``'s batch size, threads, size and output."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    size = spec["image_size"]
    image: list[Any] = [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip()]
    if spec["dtype"] == "float32":
        image.append(NormalizeImage(np.array(spec["mean"]), np.array(spec["std"]), np.float32))
    image += [ToTensor(), ToTorchImage(channels_last=False)]
    return Loader(
        spec["beton"],
        batch_size=spec["batch_size"],
        num_workers=spec["workers"],
        os_cache=True,
        order=OrderOption.RANDOM,
        drop_last=True,
        pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]},
    )


def main(argv: list[str]) -> int:
    command, spec = argv[0], json.loads(argv[1])
    if command == "write":
        write_beton(spec)
        return 0
    torch.set_num_threads(1)  # as loaders.run_child: the loader's threads are FFCV's
    print(json.dumps(run_epochs(lambda: make_loader(spec), spec["epochs"], getattr(torch, spec["dtype"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
