"""The synthetic tree as people download ImageNet today: the same images, in each publisher's layout.

From a tree written by ``synth.make_synthetic`` this writes ``split-tar``, ``hf-tar``, ``hf-parquet``,
``wds`` or ``kaggle-zip`` into ``out``, with the file names, member names and settings each publisher
uses (docs/cli.md, ``imgpipe synth``). Files and samples are spread over the archives in a shuffled
order, as the published copies are; every byte depends only on the tree and the seed (fixed times, gzip
without a name or time).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from imgpipe._sys.atomic import atomic_write, atomic_write_bytes
from imgpipe.errors import DatasetError
from imgpipe.ingest.folders import VAL_CSV, read_val_csv
from imgpipe.ingest.imagenet_tars import TRAIN_TAR
from imgpipe.ingest.kaggle_zip import KAGGLE_ZIP

LAYOUTS = ("tree", "tarballs", "split-tar", "hf-parquet", "hf-tar", "wds", "kaggle-zip")
SPLIT_PARTS = 4
HF_TRAIN_TARS = 5
PARQUET_TRAIN_FILES = 2
PARQUET_ROW_GROUP = 100  # rows per row group, as Hugging Face's datasets writes image datasets
WDS_TRAIN_SHARDS = 4
WDS_VAL_SHARDS = 2
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def write_layout(tree: Path, out: Path, layout: str, wnids: list[str], seed: int) -> int:
    """Write the synthetic ``tree`` into ``out`` in ``layout``; return the bytes written."""
    writers: dict[str, Callable[[Path, Path, list[str], int], list[Path]]] = {
        "split-tar": _split_tar, "hf-tar": _hf_tar, "hf-parquet": _hf_parquet, "wds": _wds, "kaggle-zip": _kaggle_zip,
    }  # fmt: skip
    written = writers[layout](tree, out, wnids, seed)
    return sum(path.stat().st_size for path in written)


def _train_files(tree: Path, wnids: list[str]) -> list[tuple[str, int, Path]]:
    """(wnid, label, path) of every train image, in tree order."""
    return [(wnid, label, path) for label, wnid in enumerate(wnids) for path in sorted((tree / "train" / wnid).iterdir())]


def _val_files(tree: Path, wnids: list[str]) -> list[tuple[str, int, Path]]:
    """(wnid, label, path) of every val image, labelled by the tree's val CSV."""
    folder = tree / "val"
    if not folder.is_dir():
        return []
    rows = read_val_csv(tree / VAL_CSV)
    index = {wnid: k for k, wnid in enumerate(wnids)}
    return [(rows[p.stem][0], index[rows[p.stem][0]], p) for p in sorted(folder.iterdir())]


def _shuffled(files: list[tuple[str, int, Path]], rng: np.random.Generator) -> list[tuple[str, int, Path]]:
    return [files[k] for k in rng.permutation(len(files)).tolist()]


def _deal(files: list[tuple[str, int, Path]], count: int) -> list[list[tuple[str, int, Path]]]:
    """``files`` cut into ``count`` runs of nearly equal length."""
    bounds = [len(files) * k // count for k in range(count + 1)]
    return [files[bounds[k] : bounds[k + 1]] for k in range(count)]


def _hf_name(wnid: str, path: Path) -> str:
    return f"{path.stem}_{wnid}{path.suffix}"


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, 19])


def _split_tar(tree: Path, out: Path, wnids: list[str], seed: int) -> list[Path]:
    from imgpipe.synth.tars import write_imagenet_tars

    write_imagenet_tars(tree, out, wnids, seed)
    whole = (out / TRAIN_TAR).read_bytes()
    cuts = [len(whole) * k // SPLIT_PARTS + (k % SPLIT_PARTS and 7) for k in range(SPLIT_PARTS)] + [len(whole)]  # not at 512-byte blocks
    parts = []
    for k in range(SPLIT_PARTS):
        part = out / f"{TRAIN_TAR}.{k + 1:03d}"
        atomic_write_bytes(part, whole[cuts[k] : cuts[k + 1]])
        parts.append(part)
    (out / TRAIN_TAR).unlink()
    return [*parts, *(p for p in out.iterdir() if p.is_file() and not p.name.startswith((".", TRAIN_TAR)))]


def _hf_tar(tree: Path, out: Path, wnids: list[str], seed: int) -> list[Path]:
    rng = _rng(seed)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    archives = {f"train_images_{k}.tar.gz": run for k, run in enumerate(_deal(_shuffled(_train_files(tree, wnids), rng), HF_TRAIN_TARS))}
    val = _val_files(tree, wnids)
    if val:
        archives["val_images.tar.gz"] = _shuffled(val, rng)
    written = []
    for name, files in archives.items():
        tar = _tar([(_hf_name(wnid, path), path.read_bytes()) for wnid, _, path in files])
        atomic_write_bytes(data / name, gzip.compress(tar, mtime=0))
        written.append(data / name)
    return written


def _hf_parquet(tree: Path, out: Path, wnids: list[str], seed: int) -> list[Path]:
    rng = _rng(seed)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError("synth --layout hf-parquet writes Parquet with pyarrow: pip install 'imgpipe[parquet]'") from None
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    files = {f"train-{k:05d}-of-{PARQUET_TRAIN_FILES:05d}.parquet": run
             for k, run in enumerate(_deal(_shuffled(_train_files(tree, wnids), rng), PARQUET_TRAIN_FILES))}  # fmt: skip
    val = _val_files(tree, wnids)
    if val:
        files["validation-00000-of-00001.parquet"] = _shuffled(val, rng)
    written = []
    for name, rows in files.items():
        images = [{"bytes": path.read_bytes(), "path": _hf_name(wnid, path)} for wnid, _, path in rows]
        table = pa.table({"image": pa.array(images, type=image_type), "label": pa.array([label for _, label, _ in rows], pa.int64())})
        group = min(PARQUET_ROW_GROUP, max(1, len(rows) // 3))  # a tiny file still has several row groups
        atomic_write(data / name, lambda f, t=table, g=group: pq.write_table(t, f, row_group_size=g))
        written.append(data / name)
    return written


def _wds(tree: Path, out: Path, wnids: list[str], seed: int) -> list[Path]:
    rng = _rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    shards = {
        f"imagenet1k-train-{k:04d}.tar": run for k, run in enumerate(_deal(_shuffled(_train_files(tree, wnids), rng), WDS_TRAIN_SHARDS))
    }
    val = _val_files(tree, wnids)
    if val:
        shards.update({f"imagenet1k-validation-{k:02d}.tar": run for k, run in enumerate(_deal(_shuffled(val, rng), WDS_VAL_SHARDS))})
    written = []
    for name, samples in shards.items():
        members = []
        for _, label, path in samples:
            meta = json.dumps({"filename": path.name, "label": label}).encode()
            members += [(f"{path.stem}.jpg", path.read_bytes()), (f"{path.stem}.cls", str(label).encode()), (f"{path.stem}.json", meta)]
        atomic_write_bytes(out / name, _tar(members))
        written.append(out / name)
    return written


def _kaggle_zip(tree: Path, out: Path, wnids: list[str], seed: int) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    members = [(f"ILSVRC/Data/CLS-LOC/train/{wnid}/{path.name}", path) for wnid, _, path in _train_files(tree, wnids)]
    members += [(f"ILSVRC/Data/CLS-LOC/val/{path.name}", path) for _, _, path in _val_files(tree, wnids)]
    if (tree / VAL_CSV).is_file():
        members.append((VAL_CSV, tree / VAL_CSV))
    synsets = "".join(f"{wnid} synthetic class {wnid}\n" for wnid in wnids).encode()

    def write(f: io.BufferedWriter) -> None:
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, data in [*((n, p.read_bytes()) for n, p in members), ("LOC_synset_mapping.txt", synsets)]:
                info = zipfile.ZipInfo(name, ZIP_TIME)
                info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
                archive.writestr(info, data)

    atomic_write(out / KAGGLE_ZIP, write)  # type: ignore[arg-type]
    return [out / KAGGLE_ZIP]
