"""The synthetic tree as image-net.org ships ImageNet: two tars and the devkit.

From a tree written by ``synth.make_synthetic`` this writes ``ILSVRC2012_img_train.tar`` (a ``<wnid>.tar``
per class), ``ILSVRC2012_img_val.tar`` and ``ILSVRC2012_devkit_t12.tar.gz``, whose ``meta.mat`` numbers
the leaves in a shuffled, not sorted-wnid, order, then a few parent synsets, as the real devkit does.
Members are stored in a shuffled order, as a real crawl would, so readers must sort; the bytes depend
only on the tree and the seed (fixed mtimes and owners, gzip without a time).
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import BinaryIO, Iterable

import numpy as np

from imgpipe._sys.atomic import atomic_write, atomic_write_bytes
from imgpipe.errors import DatasetError
from imgpipe.ingest.devkit import DEVKIT_NAME, GROUND_TRUTH, INSTALL_HINT, META
from imgpipe.ingest.folders import read_val_csv
from imgpipe.ingest.imagenet_tars import TRAIN_TAR, VAL_TAR

DEVKIT_FOLDER = "ILSVRC2012_devkit_t12"
PARENT_SYNSETS = 3  # non-leaf synsets in meta.mat, which a reader must leave out


def write_imagenet_tars(tree: Path, out: Path, wnids: list[str], seed: int) -> int:
    """Write the three image-net.org files of the synthetic ``tree`` into ``out``; return their total bytes."""
    rng = np.random.default_rng([seed, 17])
    order = rng.permutation(len(wnids)).tolist()
    class_tars = ((f"{wnids[k]}.tar", _tar_bytes(_files(tree / "train" / wnids[k]), rng)) for k in order)  # one in memory at a time
    atomic_write(out / TRAIN_TAR, lambda f: _write_tar(f, class_tars))
    val_files = _files(tree / "val")
    atomic_write(out / VAL_TAR, lambda f: _write_tar(f, [val_files[k] for k in rng.permutation(len(val_files)).tolist()]))
    csv = tree / "LOC_val_solution.csv"
    labels = {image_id: wnid for image_id, (wnid, _) in read_val_csv(csv).items()} if csv.is_file() else {}
    devkit = _devkit(wnids, [labels[name.rsplit(".", 1)[0]] for name, _ in val_files], rng)
    atomic_write_bytes(out / DEVKIT_NAME, devkit)
    return sum((out / name).stat().st_size for name in (TRAIN_TAR, VAL_TAR, DEVKIT_NAME))


def _files(folder: Path) -> list[tuple[str, bytes]]:
    """(name, bytes) of the files in ``folder``, sorted by name."""
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()] if folder.is_dir() else []


def _tar_bytes(files: list[tuple[str, bytes]], rng: np.random.Generator) -> bytes:
    buffer = io.BytesIO()
    _write_tar(buffer, [files[k] for k in rng.permutation(len(files)).tolist()])
    return buffer.getvalue()


def _write_tar(f: BinaryIO, files: Iterable[tuple[str, bytes]]) -> None:
    with tarfile.open(fileobj=f, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))


def _devkit(wnids: list[str], val_wnids: list[str], rng: np.random.Generator) -> bytes:
    """The devkit .tar.gz: meta.mat with shuffled leaf IDs plus parents, and the val ground truth."""
    try:
        from scipy.io import savemat
    except ImportError:
        raise DatasetError(f"synth --tars writes the devkit's {META} with scipy: {INSTALL_HINT}") from None
    leaf_order = rng.permutation(len(wnids)).tolist()  # leaf_order[i] is the class whose ID is i + 1
    id_of = {wnids[k]: i + 1 for i, k in enumerate(leaf_order)}
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height", "num_train_images"]
    rows = [(id_of[w], w, f"class {w}", "a synthetic class", 0, np.zeros((1, 0)), 0, 0) for w in (wnids[k] for k in leaf_order)]
    for p in range(PARENT_SYNSETS):
        children = np.array([[i + 1 for i in range(p, len(wnids), PARENT_SYNSETS)]], dtype=np.float64)
        rows.append((len(wnids) + p + 1, f"n{99_000_000 + p:08d}", f"parent {p}", "a synthetic parent", children.size, children, 1, 0))
    synsets = np.empty((len(rows), 1), dtype=[(name, object) for name in fields])
    for i, row in enumerate(rows):
        synsets[i, 0] = tuple(np.array([[value]], dtype=np.float64) if isinstance(value, int) else value for value in row)
    meta = io.BytesIO()
    savemat(meta, {"synsets": synsets})
    truth = "".join(f"{id_of[w]}\n" for w in val_wnids).encode()
    archive = io.BytesIO()
    _write_tar(archive, [(f"{DEVKIT_FOLDER}/{META}", meta.getvalue()), (f"{DEVKIT_FOLDER}/{GROUND_TRUTH}", truth)])
    return gzip.compress(archive.getvalue(), mtime=0)
