"""Val labels from image-net.org's ``ILSVRC2012_devkit_t12.tar.gz``, read without extracting it.

Two members matter: ``data/meta.mat`` lists the synsets (``ILSVRC2012_ID``, ``WNID``,
``num_children``; the classes are the leaves, ``num_children == 0``) and
``data/ILSVRC2012_validation_ground_truth.txt`` holds one ILSVRC2012_ID per val image, line
k for ``ILSVRC2012_val_{k:08d}``. The devkit numbers its classes in its own order, not in
sorted-wnid order: callers map the wnid to their class index, never the ID. ``meta.mat``
is a MATLAB file, read with ``scipy.io.loadmat`` (the ``devkit`` extra).
"""

from __future__ import annotations

import io
import re
import struct
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgpipe._sys.oserrors import describe
from imgpipe.errors import DatasetError
from imgpipe.ingest.folders import VAL_CSV
from imgpipe.ingest.tarwalk import CheckedTarInfo

DEVKIT_NAME = "ILSVRC2012_devkit_t12.tar.gz"
META = "data/meta.mat"
GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
VAL_NAME = re.compile(r"ILSVRC2012_val_(\d+)\.[^/]*$")
INSTALL_HINT = "pip install 'imgpipe[devkit]'"
MAX_MEMBER_BYTES = 16 << 20  # meta.mat and the ground truth hold a few hundred KB; a larger claim is not read whole


@dataclass(frozen=True)
class Devkit:
    """The leaf synsets (ILSVRC2012_ID -> wnid) and the val ground truth (IDs in val-number order)."""

    path: Path
    wnid_of_id: dict[int, str]
    ground_truth: np.ndarray  # int64, line k-1 is the ID of ILSVRC2012_val_{k:08d}

    @property
    def wnids(self) -> list[str]:
        """The leaf wnids, sorted (ImageFolder's class order)."""
        return sorted(self.wnid_of_id.values())

    def val_wnid(self, name: str) -> str:
        """The wnid of the val image named ``name`` (``.../ILSVRC2012_val_00000001.JPEG``)."""
        match = VAL_NAME.search(name)
        if match is None:
            raise DatasetError(f"{name}: not named ILSVRC2012_val_<number>, so {self.path.name} has no label for it")
        number = int(match.group(1))
        if not 1 <= number <= len(self.ground_truth):
            raise DatasetError(f"{name}: {self.path}: {GROUND_TRUTH} has {len(self.ground_truth)} lines, none for image {number}")
        ident = int(self.ground_truth[number - 1])
        wnid = self.wnid_of_id.get(ident)
        if wnid is None:
            raise DatasetError(f"{self.path}: {GROUND_TRUTH}: line {number}: ID {ident} is not a leaf synset of {META}")
        return wnid


def read_devkit(path: Path) -> Devkit:
    """Read the leaf synsets and the val ground truth from the devkit archive at ``path``."""
    members = _read_members(path, (META, GROUND_TRUTH))
    return Devkit(path, _leaf_synsets(path, members[META]), _ground_truth(path, members[GROUND_TRUTH]))


def _read_members(path: Path, wanted: tuple[str, ...]) -> dict[str, bytes]:
    """The bytes of the members ending in ``wanted`` (e.g. ``ILSVRC2012_devkit_t12/data/meta.mat``)."""
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:*", tarinfo=CheckedTarInfo) as archive:
            for member in archive:
                name = next((w for w in wanted if member.name == w or member.name.endswith("/" + w)), None)
                if name is not None and member.isreg() and name not in found:
                    if member.size > MAX_MEMBER_BYTES:
                        raise DatasetError(f"{path}: member {member.name} claims {member.size:,} bytes; download {DEVKIT_NAME} again")
                    found[name] = archive.extractfile(member).read()  # type: ignore[union-attr]
    except FileNotFoundError:
        raise DatasetError(f"{path}: devkit not found") from None
    except OSError as e:
        if e.errno is None:  # gzip's BadGzipFile: the bytes, not the file system
            raise DatasetError(f"{path}: unreadable devkit archive ({e}); download {DEVKIT_NAME} again") from None
        raise DatasetError(f"{path}: cannot read it: {describe(e, writing=False)}") from None
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise DatasetError(f"{path}: unreadable devkit archive ({e}); download {DEVKIT_NAME} again") from None
    missing = [w for w in wanted if w not in found]
    if missing:
        raise DatasetError(f"{path}: no {missing[0]} inside; is this {DEVKIT_NAME}? download it again")
    return found


def can_read_meta() -> bool:
    """Is scipy (the ``devkit`` extra) importable? The devkit's meta.mat is a MATLAB file."""
    try:
        import scipy.io  # noqa: F401
    except ImportError:
        return False
    return True


def _leaf_synsets(path: Path, data: bytes) -> dict[int, str]:
    if not can_read_meta():
        raise DatasetError(
            f"{path}: reading the devkit's {META} needs scipy: {INSTALL_HINT} (or put Kaggle's {VAL_CSV} beside the val tar)"
        )
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    where = f"{path}: {META}"
    try:
        synsets = loadmat(io.BytesIO(data), squeeze_me=True)["synsets"]
        ids, wnids, children = (np.atleast_1d(synsets[field]) for field in ("ILSVRC2012_ID", "WNID", "num_children"))
    except KeyError as e:
        raise DatasetError(f"{where}: no {e} field; download {DEVKIT_NAME} again") from None
    except (
        MatReadError,
        ValueError,
        TypeError,
        IndexError,
        OSError,
        NotImplementedError,
        struct.error,
        zlib.error,
    ) as e:  # bytes that are no MATLAB file
        raise DatasetError(
            f"{where}: unreadable, not a MATLAB file scipy can read ({type(e).__name__}: {e}); download {DEVKIT_NAME} again"
        ) from None
    leaves: dict[int, str] = {}
    for ident, wnid, count in zip(ids.tolist(), wnids.tolist(), children.tolist()):
        if int(count) == 0:
            if int(ident) in leaves or not isinstance(wnid, str):
                raise DatasetError(f"{where}: leaf ID {ident} ({wnid!r}) is repeated or has no wnid; download {DEVKIT_NAME} again")
            leaves[int(ident)] = wnid
    if not leaves:
        raise DatasetError(f"{where}: no leaf synsets (num_children == 0); download {DEVKIT_NAME} again")
    return leaves


def _ground_truth(path: Path, data: bytes) -> np.ndarray:
    lines = data.decode("ascii", "replace").split()
    try:
        return np.array([int(line) for line in lines], dtype=np.int64)
    except ValueError:
        bad = next(k for k, line in enumerate(lines, 1) if not line.isdigit())
        raise DatasetError(f"{path}: {GROUND_TRUTH}: line {bad}: {lines[bad - 1]!r} is not an ILSVRC2012_ID") from None
