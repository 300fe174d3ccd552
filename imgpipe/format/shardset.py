"""ShardSet: the records of one split, from a packed folder or bare .rec/.idx files, as one indexed sequence.

The whole index lives in a few numpy arrays (shard number, start and end offset, key per
record: about 28 bytes a record), so workers never hold per-record Python objects and a
forked worker's memory stays flat. Files are opened lazily in each process: the set
remembers the pid that opened them, reopens after a fork, and pickles without them.
"""

from __future__ import annotations

import glob as globlib
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from imgpipe.format import recordio
from imgpipe.errors import DatasetError, RecordIOError
from imgpipe.format.layout import SHARD_FILE, SidecarError, SourceLines, parse_labels, parse_sources
from imgpipe.format.manifest import Manifest, load_manifest, manifest_path, unfinished_pack

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


class ShardSet:
    """The records of one split in record order: ``len()``, ``labels``, ``classes``, ``read(i)``."""

    def __init__(
        self,
        rec_paths: Sequence[Path],
        shard: np.ndarray,
        offsets: np.ndarray,
        ends: np.ndarray,
        keys: np.ndarray,
        *,
        split: str,
        labels: np.ndarray | None = None,
        classes: list[str] | None = None,
        sources_path: Path | None = None,
    ) -> None:
        self.rec_paths = [Path(p) for p in rec_paths]
        self.split = split
        self.classes = classes
        self._shard, self._offsets, self._ends, self._keys = shard, offsets, ends, keys
        self._labels = labels
        self._sources_path = sources_path
        self._sources: tuple[bytes, np.ndarray] | None = None
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    # ------------------------------------------------------------------ sequence

    def __len__(self) -> int:
        return int(self._offsets.size)

    def __repr__(self) -> str:
        return f"ShardSet({self.split!r}, {len(self)} records in {len(self.rec_paths)} .rec files)"

    @property
    def labels(self) -> np.ndarray:
        """The label of every record, in record order (int64); read from the IRHeaders if there is no sidecar."""
        if self._labels is None:
            self._labels = self._labels_from_headers()
        return self._labels

    @property
    def keys(self) -> np.ndarray:
        """The .idx key (IRHeader id) of every record, in record order (int64)."""
        return self._keys

    def location(self, i: int) -> tuple[int, int, int]:
        """(shard number, start offset, end offset) of record ``i``."""
        i = self._check_index(i)
        return int(self._shard[i]), int(self._offsets[i]), int(self._ends[i])

    def read(self, i: int) -> tuple[recordio.IRHeader, bytes]:
        """The IRHeader and payload of record ``i``: one ``pread`` of its bytes, then parsing."""
        header, payload = self.read_view(i)
        return header, bytes(payload)

    def read_view(self, i: int) -> tuple[recordio.IRHeader, memoryview]:
        """``read`` without copying the payload: a read-only view of the one ``pread`` buffer (the loaders' path)."""
        shard, start, end = self.location(i)
        path = self.rec_paths[shard]
        buf = os.pread(self._fd(shard), end - start, start)
        record, _ = recordio.parse_record(buf, 0, len(buf), path, base=start)
        header, payload = recordio.unpack_header(record, path, start)
        return header, memoryview(payload)

    def source(self, i: int) -> str | None:
        """The source path of record ``i`` (relative to the pack's source root), if a sidecar exists."""
        i = self._check_index(i)
        if self._sources_path is None:
            return None
        if self._sources is None:
            self._sources = _read_sources(self._sources_path, len(self))
        return self._sources.raw(i).rstrip(b"\r\n").decode("utf-8", "replace")

    def describe(self, i: int) -> str:
        """Where record ``i`` lives, for error messages."""
        shard, start, _ = self.location(i)
        where = f"{self.rec_paths[shard].name} record {int(i)} (id {int(self._keys[i])}, offset {start}"
        try:
            source = self.source(i)
        except (OSError, DatasetError):
            source = None
        return where + (f", source {source})" if source else ")")

    @property
    def packed(self) -> bool:
        """True for a split of a packed folder (with a manifest), False for bare .rec files."""
        return self._sources_path is not None

    def record_locations(self) -> tuple[np.ndarray, np.ndarray]:
        """The shard number and start offset of every record, in record order (read-only arrays)."""
        shard, offsets = self._shard.view(), self._offsets.view()
        shard.flags.writeable = offsets.flags.writeable = False
        return shard, offsets

    # ------------------------------------------------------------------ process safety

    def _fd(self, shard: int) -> int:
        pid = os.getpid()
        if pid != self._pid:  # forked: the inherited descriptors share file offsets with the parent
            for fd in self._fds.values():
                os.close(fd)
            self._fds, self._pid = {}, pid
        fd = self._fds.get(shard)
        if fd is None:
            try:
                fd = os.open(self.rec_paths[shard], os.O_RDONLY)
            except OSError as e:
                raise DatasetError(f"{self.rec_paths[shard]}: cannot open shard ({e.strerror})") from None
            self._fds[shard] = fd
        return fd

    def close(self) -> None:
        """Close the files this process opened (they reopen on the next read)."""
        if self._pid == os.getpid():
            for fd in self._fds.values():
                os.close(fd)
        self._fds = {}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fds"], state["_sources"] = {}, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    # ------------------------------------------------------------------ helpers

    def _check_index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} is out of range for {n} records of split {self.split!r}")
        return int(i) % n

    def _labels_from_headers(self) -> np.ndarray:
        labels = np.empty(len(self), dtype=np.int64)
        for i in range(len(self)):
            labels[i] = self._label_of(i)
        return labels

    def _label_of(self, i: int) -> int:
        shard, start, end = self.location(i)
        label = recordio.peek_scalar_label(os.pread(self._fd(shard), min(recordio.LABEL_PROBE_BYTES, end - start), start))
        if label is not None:
            return _integral_label(label, self, i)
        header, _ = self.read(i)
        label = header.label if header.flag == 0 else (header.label[0] if len(header.label) else float("nan"))
        return _integral_label(float(label), self, i)


def _integral_label(label: float, shards: ShardSet, i: int) -> int:
    if not np.isfinite(label) or label != int(label) or label < 0:
        raise DatasetError(f"{shards.describe(i)}: label {label} is not a class index")
    return int(label)


def _read_sources(path: Path, count: int) -> SourceLines:
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the sources sidecar ({e.strerror})") from None
    try:
        return parse_sources(blob, count)
    except SidecarError as e:
        raise DatasetError(f"{path}: {e}; rerun 'imgpipe pack'") from None


# ---------------------------------------------------------------------- opening


def open_shards(path: PathLike | Sequence[PathLike], split: str = "train") -> ShardSet:
    """Open a packed folder (with manifest.json), or bare .rec files with their .idx (path, list or glob).

    In a folder without a manifest only file names decide the split: ``{split}-NNNNN-of-NNNNN.rec``
    or ``{split}.rec`` (im2rec's prefix). Given files or a glob, every file given is read as
    ``split``, and a shard named for another split is an error (a ``*.rec`` glob would mix them).
    """
    if isinstance(path, (str, os.PathLike)) and Path(path).is_dir():
        if manifest_path(path).is_file():
            return _open_packed(Path(path), split)
        unfinished = unfinished_pack(path)
        if unfinished is not None:
            raise DatasetError(unfinished)
        return _open_bare(_split_files(Path(path), split), split)
    recs = _expand(path)
    other = next((rec for rec in recs if SHARD_FILE.match(rec.name) and _split_of(rec) != split), None)
    if other is not None:
        named = _split_of(other)
        raise DatasetError(f"{other}: a shard of split {named!r}, opened as split {split!r}; give only that split's files and split={named!r}")
    return _open_bare(recs, split)


def _split_files(folder: Path, split: str) -> list[Path]:
    """The .rec files of ``split`` in a folder without a manifest, chosen by file name only."""
    recs = sorted(folder.glob("*.rec"))
    if not recs:
        raise DatasetError(f"{folder}: no manifest.json and no .rec files; is it a folder made by 'imgpipe pack'?")
    named = {rec: _split_of(rec) for rec in recs}
    mine = [rec for rec, name in named.items() if name == split]
    if not mine:
        raise DatasetError(
            f"{folder}: no manifest.json and no {split}-NNNNN-of-NNNNN.rec or {split}.rec for split {split!r} "
            f"(the file names give: {', '.join(sorted(set(named.values())))}); pass the .rec files themselves to read them as {split!r}"
        )
    return mine


def _split_of(rec: Path) -> str:
    """The split a .rec file's name states: ``{split}-00001-of-00008.rec`` or ``{split}.rec``."""
    match = SHARD_FILE.match(rec.name)
    return match["split"] if match else rec.stem


def _expand(path: PathLike | Sequence[PathLike]) -> list[Path]:
    items = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not items:
        raise DatasetError("no .rec files given")
    recs: list[Path] = []
    for item in items:
        text = os.fspath(item)
        if globlib.has_magic(text):
            matches = sorted(globlib.glob(text))
            if not matches:
                raise DatasetError(f"{text}: the pattern matches no files")
            recs.extend(Path(m) for m in matches)
        else:
            recs.append(Path(text))
    for rec in recs:
        if not rec.exists():
            raise DatasetError(f"{rec}: no such file or folder")
        if rec.suffix != ".rec" or not rec.is_file():
            raise DatasetError(f"{rec}: expected a .rec file (or a folder made by 'imgpipe pack')")
    return recs


def _open_packed(folder: Path, split: str) -> ShardSet:
    manifest: Manifest = load_manifest(folder)
    if split not in manifest.splits:
        raise DatasetError(f"{manifest_path(folder)}: no split {split!r} (it has {', '.join(sorted(manifest.splits)) or 'none'})")
    info = manifest.splits[split]
    recs = [folder / s.name for s in info.shards]
    shard, offsets, ends, keys = _index_arrays(recs, [folder / s.index for s in info.shards], [s.records for s in info.shards])
    labels = _read_labels(folder / info.labels, len(offsets), len(manifest.classes))
    return ShardSet(recs, shard, offsets, ends, keys, split=split, labels=labels, classes=list(manifest.classes), sources_path=folder / info.sources)


def _open_bare(recs: list[Path], split: str) -> ShardSet:
    idxs = [rec.with_suffix(".idx") for rec in recs]
    shard, offsets, ends, keys = _index_arrays(recs, idxs, None)
    return ShardSet(recs, shard, offsets, ends, keys, split=split)


def _index_arrays(
    recs: list[Path], idxs: list[Path], expected: list[int] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read every .idx into (shard number, offset, end, key) arrays, one entry per record.

    Each shard's arrays are copied into the outputs as soon as it is read, so the peak is the
    outputs plus one shard's index, not twice the whole index.
    """
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for number, (rec, idx) in enumerate(zip(recs, idxs)):
        if not rec.is_file():
            raise DatasetError(f"{rec}: shard is missing; run 'imgpipe verify' on its folder")
        if not idx.is_file():
            raise DatasetError(f"{idx}: index is missing for {rec.name}; rebuild it (im2rec --pack-label or 'imgpipe pack')")
        try:
            key, offset = recordio.read_index(idx)
        except RecordIOError as e:
            raise DatasetError(str(e)) from None
        if expected is not None and key.size != expected[number]:
            raise DatasetError(f"{idx}: {key.size} records, the manifest says {expected[number]}; run 'imgpipe verify'")
        size = rec.stat().st_size
        if offset.size and offset.max() >= size:
            raise DatasetError(f"{idx}: offset {int(offset.max())} is past the end of {rec.name} ({size} bytes); rebuild the index")
        parts.append((key, offset, _record_ends(offset, size)))
    counts = [key.size for key, _, _ in parts]
    shard = np.repeat(np.arange(len(parts), dtype=np.int32), counts)
    total = int(sum(counts))
    keys, offsets, ends = (np.empty(total, dtype=np.int64) for _ in range(3))
    start = 0
    while parts:
        key, offset, end = parts.pop(0)
        stop = start + key.size
        keys[start:stop], offsets[start:stop], ends[start:stop] = key, offset, end
        start = stop
    return shard, offsets, ends, keys


def _record_ends(offsets: np.ndarray, size: int) -> np.ndarray:
    """Where each record's bytes end: the next record's start in file order, or the file size."""
    if offsets.size == 0 or bool(np.all(offsets[1:] > offsets[:-1])):
        return np.append(offsets[1:], size)
    order = np.argsort(offsets, kind="stable")
    ends = np.empty_like(offsets)
    ends[order] = np.append(offsets[order][1:], size)
    return ends


def _read_labels(path: Path, count: int, classes: int) -> np.ndarray:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: labels sidecar is missing; rerun 'imgpipe pack'") from None
    except OSError as e:
        raise DatasetError(f"{path}: unreadable labels sidecar ({e}); rerun 'imgpipe pack'") from None
    try:
        return parse_labels(data, count, classes)
    except SidecarError as e:
        where = "" if e.record is None else f"record {e.record}: "
        raise DatasetError(f"{path}: {where}{e}; rerun 'imgpipe pack'") from None
