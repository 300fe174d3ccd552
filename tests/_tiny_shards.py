"""Tiny packed datasets made on the fly for the loader tests: real JPEGs, real shards, real manifest."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from imgpipe._sys.checksum import sha256_file
from imgpipe.format.manifest import Manifest, ShardInfo, SplitInfo, write_manifest
from imgpipe.format.recordio import IndexedRecordWriter, IRHeader, pack_header


def tiny_jpeg(rng: np.random.Generator, width: int, height: int) -> bytes:
    """A small noisy gradient JPEG (different per call, quick to decode)."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    noise = rng.integers(0, 40, size=(height, width, 3))
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


def make_tiny_pack(
    dst: Path,
    *,
    records: int = 24,
    shards: int = 2,
    classes: int = 3,
    split: str = "train",
    min_side: int = 24,
    max_side: int = 64,
    corrupt: tuple[int, ...] = (),
    seed: int = 0,
) -> Path:
    """Pack ``records`` JPEGs into ``shards`` shards of ``split`` with labels/sources sidecars and a manifest.

    Records listed in ``corrupt`` get a payload that is not an image. Keys (ids) are
    ``2 * index`` to mimic gaps left by skipped sources.
    """
    dst.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    wnids = [f"n{k:08d}" for k in range(classes)]
    labels = (np.arange(records) % classes).astype(np.int32)
    sources = [f"{split}/{wnids[labels[i]]}/{wnids[labels[i]]}_{i}.JPEG" for i in range(records)]
    bounds = np.linspace(0, records, shards + 1).round().astype(int)
    infos = []
    for s in range(shards):
        name = f"{split}-{s:05d}-of-{shards:05d}"
        rec, idx = dst / f"{name}.rec", dst / f"{name}.idx"
        with IndexedRecordWriter(rec, idx) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                w, h = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
                payload = b"definitely not a JPEG" * 3 if i in corrupt else tiny_jpeg(rng, w, h)
                writer.write(2 * i, pack_header(IRHeader(0, float(labels[i]), 2 * i, 0), payload))
        infos.append(
            ShardInfo(
                name=rec.name,
                index=idx.name,
                records=int(bounds[s + 1] - bounds[s]),
                bytes=rec.stat().st_size,
                sha256=sha256_file(rec),
                index_bytes=idx.stat().st_size,
                index_sha256=sha256_file(idx),
            )
        )
    (dst / f"{split}.sources.txt").write_text("".join(p + "\n" for p in sources), encoding="utf-8")
    np.save(dst / f"{split}.labels.npy", labels, allow_pickle=False)
    split_info = SplitInfo(
        shards=infos,
        sources=f"{split}.sources.txt",
        sources_sha256=sha256_file(dst / f"{split}.sources.txt"),
        labels=f"{split}.labels.npy",
        labels_sha256=sha256_file(dst / f"{split}.labels.npy"),
    )
    write_manifest(dst, Manifest(classes=wnids, splits={split: split_info}, options={}, source="/nowhere"))
    return dst


def without_index_sidecar(folder: Path) -> None:
    """A packed ``folder`` as packs made before the index sidecar are: no sidecar, no mention of it in the manifest."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for split in manifest["splits"].values():
        (folder / split.pop("index_sidecar")).unlink()
        del split["index_sidecar_sha256"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
