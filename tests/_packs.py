"""Helpers on the packs the session fixtures make with ``imgpipe.pack`` (conftest.py): damaged copies, an
older pack's files (no index sidecar), and one noisy JPEG for the decode tests."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from imgpipe.format.recordio import IRHeader, frame_parts, pack_header
from imgpipe.format.shardset import open_shardset

INDEXED_RECORDS = 37  # the records of conftest's ``indexed`` pack
NOT_AN_IMAGE = b"definitely not a JPEG" * 3


def with_payloads(pack: Path, dst: Path, payloads: dict[int, bytes], split: str = "train") -> Path:
    """A copy of ``pack`` at ``dst`` whose records ``payloads`` (record -> new image bytes) hold those bytes, each
    framed where its record was (it must fit there), so the index still finds every record; the shard's sha256 and
    the crc32 sidecar no longer match, as after damage on the disk."""
    shutil.copytree(pack, dst)
    shards = open_shardset(dst, split)
    for record, payload in payloads.items():
        shard, start, end = shards.location(record)
        header, _ = shards.read(record)
        framed = b"".join(frame_parts(pack_header(IRHeader(0, header.label, header.id, header.id2), payload)))
        assert header.flag == 0 and len(framed) <= end - start, f"record {record}: a scalar label, and bytes that fit in its place"
        with open(shards.rec_paths[shard], "r+b") as f:
            f.seek(start)
            f.write(framed)
    return dst


def without_index_sidecar(folder: Path) -> None:
    """A packed ``folder`` as packs made before the index sidecar are: no sidecar, no mention of it in the manifest."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for split in manifest["splits"].values():
        (folder / split.pop("index_sidecar")).unlink()
        del split["index_sidecar_sha256"]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def noisy_jpeg(rng: np.random.Generator, width: int, height: int) -> bytes:
    """A noisy gradient JPEG of ``width`` x ``height`` (different per call, quick to decode)."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    pixels = np.clip(base + rng.integers(0, 40, size=(height, width, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


def im2rec_labels(recs: list[Path]) -> list[int]:
    """The labels the .lst files beside MXNet im2rec's ``recs`` list, in record order (im2rec writes a .rec in its .lst's order)."""
    return [int(float(row.split("\t")[1])) for rec in recs for row in rec.with_suffix(".lst").read_text().splitlines()]
