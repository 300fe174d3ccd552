"""ShardSet: the records of one split, from a packed folder, a URL or bare .rec/.idx files, as one indexed sequence.

The whole index lives in a few numpy arrays (shard number, start and end offset, key per
record: about 28 bytes a record), so workers never hold per-record Python objects and a
forked worker's memory stays flat. The index says which bytes a record is; a ``ByteSource``
(``imgpipe.storage``) fetches them: ``pread`` from a local folder, concurrent range GETs from a
URL, where every record is also checked against the crc32 sidecar. Sources open files and
clients lazily in each process: they reopen after a fork and pickle without them.
"""

from __future__ import annotations

import glob as globlib
import logging
import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from imgpipe._sys.checksum import crc32
from imgpipe._sys.regular import read_regular
from imgpipe.errors import DatasetError, ImgpipeError, RecordIOError, RemoteError
from imgpipe.format import recordio
from imgpipe.format.files import SHARD_FILE, SidecarError, SourceLines, parse_checksums, parse_index_sidecar, parse_labels, parse_sources
from imgpipe.format.manifest import MANIFEST_NAME, Manifest, SplitInfo, fetch_manifest, load_manifest, manifest_path
from imgpipe.format.unfinished import incomplete_folder
from imgpipe.storage.local import LocalSource
from imgpipe.storage.opening import open_source
from imgpipe.storage.source import ByteRange, ByteSource, RangeError, is_url

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


class ShardSet:
    """The records of one split in record order: ``len()``, ``labels``, ``classes``, ``read(i)``, ``fetch(indices)``."""

    def __init__(
        self,
        source: ByteSource,
        rec_names: Sequence[str],
        shard: np.ndarray,
        offsets: np.ndarray,
        ends: np.ndarray,
        keys: np.ndarray,
        *,
        split: str,
        labels: np.ndarray | None = None,
        classes: list[str] | None = None,
        sources_name: str | None = None,
        checksums: np.ndarray | None = None,
        shard_bytes: Sequence[int] = (),
    ) -> None:
        self.byte_source = source
        self.rec_names = list(rec_names)
        self.split = split
        self.classes = classes
        self._shard, self._offsets, self._ends, self._keys = shard, offsets, ends, keys
        self._labels = labels
        self._sources_name = sources_name
        self._sources: SourceLines | None = None
        self._checksums = checksums  # checked on every remote read
        self._shard_bytes = list(shard_bytes)
        self._where = [source.where(name) for name in self.rec_names]  # in errors about the bytes
        self._shown = self._where if source.remote else [Path(name).name for name in self.rec_names]  # in a record's description
        self._ahead: dict[bytes, Future] = {}  # remote batches being fetched ahead, by their record indices
        self._ahead_pid = os.getpid()

    # ------------------------------------------------------------------ sequence

    def __len__(self) -> int:
        return int(self._offsets.size)

    def __repr__(self) -> str:
        where = f" at {self.byte_source.location}" if self.byte_source.remote else ""
        return f"ShardSet({self.split!r}, {len(self)} records in {len(self.rec_names)} .rec files{where})"

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

    @property
    def rec_paths(self) -> list[Path]:
        """The local paths of the .rec files (a ``DatasetError`` for a split read from a URL)."""
        if not isinstance(self.byte_source, LocalSource):
            raise DatasetError(f"{self.byte_source.location}: the shards are not on a local disk; copy them to a local folder first")
        return [self.byte_source.path(name) for name in self.rec_names]

    @property
    def data_bytes(self) -> int:
        """The total size of the .rec files."""
        return sum(self._shard_bytes) if self._shard_bytes else sum(self.byte_source.size(name) for name in self.rec_names)

    def location(self, i: int) -> tuple[int, int, int]:
        """(shard number, start offset, end offset) of record ``i``."""
        i = self._check_index(i)
        return int(self._shard[i]), int(self._offsets[i]), int(self._ends[i])

    def read(self, i: int) -> tuple[recordio.IRHeader, bytes]:
        """The IRHeader and payload of record ``i``: one read of its bytes, then parsing."""
        header, payload = self.read_view(i)
        return header, bytes(payload)

    def read_view(self, i: int) -> tuple[recordio.IRHeader, memoryview]:
        """``read`` without copying the payload: a read-only view of the one read buffer (the loaders' path)."""
        if self.byte_source.remote:
            return self.fetch([i]).read_view(0)
        shard, start, end = self.location(i)
        return _parse(self.byte_source.read_range(self.rec_names[shard], start, end), self._where[shard], start)

    def fetch(self, indices: Sequence[int] | np.ndarray, ahead: Sequence[Sequence[int] | np.ndarray] = ()) -> Records:
        """The records ``indices``, read together: ``fetch(...).read_view(k)`` is ``read_view(indices[k])``.

        From a URL they arrive in one batched request (see ``objectstore``), each checked against its
        crc32; a record that stays unreadable raises a ``RemoteError`` from its ``read_view`` only.
        ``ahead``: the batches of records this process will likely ask for next, in order, fetched
        meanwhile (those of the last call, and one more, are kept). A local folder reads each record
        when it is asked for.
        """
        indices = np.asarray(indices, dtype=np.int64)
        if not self.byte_source.remote:
            return LocalRecords(self, indices)
        pending = self._pending_fetches()
        buffers = (pending.pop(indices.tobytes(), None) or self._submit(indices)).result()
        for batch in ahead:  # started once this batch is in: they never compete with it
            upcoming = np.asarray(batch, dtype=np.int64)
            if len(upcoming) and upcoming.tobytes() not in pending:
                while len(pending) > len(ahead):
                    pending.pop(next(iter(pending)))
                pending[upcoming.tobytes()] = self._submit(upcoming)
        return FetchedRecords(self, indices, buffers)

    def source(self, i: int) -> str | None:
        """The source path of record ``i`` (relative to the pack's source root), if a sidecar exists."""
        i = self._check_index(i)
        if self._sources_name is None:
            return None
        if self._sources is None:
            self._sources = _read_sources(self.byte_source, self._sources_name, len(self))
        return self._sources.raw(i).rstrip(b"\r\n").decode("utf-8", "replace")

    def describe(self, i: int) -> str:
        """Where record ``i`` lives, for error messages (a remote sources sidecar is named only once it was read)."""
        shard, start, _ = self.location(i)
        where = f"{self._shown[shard]} record {int(i)} (id {int(self._keys[i])}, offset {start}"
        source = None
        if not self.byte_source.remote or self._sources is not None:
            try:
                source = self.source(i)
            except (OSError, DatasetError):
                pass
        return where + (f", source {source})" if source else ")")

    @property
    def packed(self) -> bool:
        """True for a split of a packed folder (with a manifest), False for bare .rec files."""
        return self._sources_name is not None

    def record_locations(self) -> tuple[np.ndarray, np.ndarray]:
        """The shard number and start offset of every record, in record order (read-only arrays)."""
        shard, offsets = self._shard.view(), self._offsets.view()
        shard.flags.writeable = offsets.flags.writeable = False
        return shard, offsets

    # ------------------------------------------------------------------ remote reads

    def _submit(self, indices: np.ndarray) -> Future:
        shards, starts, ends = self._shard[indices], self._offsets[indices], self._ends[indices]
        ranges = [ByteRange(self.rec_names[s], int(a), int(b)) for s, a, b in zip(shards.tolist(), starts.tolist(), ends.tolist())]
        crcs = None if self._checksums is None else self._checksums[indices]

        def check(k: int, data: memoryview) -> str | None:
            return record_problem(data, ranges[k], None if crcs is None else int(crcs[k]))

        return self.byte_source.submit_ranges(ranges, check)

    def _pending_fetches(self) -> dict[bytes, Future]:
        if self._ahead_pid != os.getpid():  # forked: the parent's fetches are not this process's
            self._ahead, self._ahead_pid = {}, os.getpid()
        return self._ahead

    # ------------------------------------------------------------------ process safety

    def close(self) -> None:
        """Close the files this process opened (they reopen on the next read)."""
        self.byte_source.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sources"], state["_ahead"] = None, {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ahead_pid = os.getpid()

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
        label = recordio.peek_scalar_label(
            self.byte_source.read_range(self.rec_names[shard], start, min(start + recordio.LABEL_PROBE_BYTES, end))
        )
        if label is not None:
            return _integral_label(label, self, i)
        header, _ = self.read(i)
        label = header.label if header.flag == 0 else (header.label[0] if len(header.label) else float("nan"))
        return _integral_label(float(label), self, i)


class LocalRecords:
    """The records of a batch in a local folder: each read when asked for (no copy: the pread buffer)."""

    def __init__(self, shards: ShardSet, indices: np.ndarray) -> None:
        self.shards = shards
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def read_view(self, k: int) -> tuple[recordio.IRHeader, memoryview]:
        return self.shards.read_view(int(self.indices[k]))


class FetchedRecords:
    """The records of a batch fetched from a URL: each one's checked bytes, or why it stayed unreadable."""

    def __init__(self, shards: ShardSet, indices: np.ndarray, buffers: list[memoryview | ImgpipeError]) -> None:
        self.shards = shards
        self.indices = indices
        self._buffers = buffers

    def __len__(self) -> int:
        return len(self.indices)

    def read_view(self, k: int) -> tuple[recordio.IRHeader, memoryview]:
        """Record ``indices[k]``; a ``RemoteError`` naming the URL, the shard and the record if it stayed unreadable."""
        data = self._buffers[k]
        i = int(self.indices[k])
        if isinstance(data, ImgpipeError):
            reason = data.reason if isinstance(data, RangeError) else str(data)
            raise RemoteError(f"{self.shards.describe(i)}: {reason}")
        shard, start, _ = self.shards.location(i)
        return _parse(data, self.shards._where[shard], start)


Records = LocalRecords | FetchedRecords


def record_problem(data: memoryview, byte_range: ByteRange, crc: int | None) -> str | None:
    """Why the bytes read for one record are not it (its framing, its crc32 from the sidecar), or None."""
    try:
        record, _ = recordio.parse_record(data, 0, len(data), byte_range.name, base=byte_range.start)
    except RecordIOError as e:
        return e.problem
    if crc is not None and crc32(record) != crc:
        return "crc32 differs from the checksum sidecar"
    return None


def _parse(buf: bytes | memoryview, where: str, start: int) -> tuple[recordio.IRHeader, memoryview]:
    record, _ = recordio.parse_record(buf, 0, len(buf), where, base=start)
    header, payload = recordio.unpack_header(record, where, start)
    return header, memoryview(payload)


def _integral_label(label: float, shards: ShardSet, i: int) -> int:
    if not np.isfinite(label) or label != int(label) or label < 0:
        raise DatasetError(f"{shards.describe(i)}: label {label} is not a class index")
    return int(label)


def _read_sources(source: ByteSource, name: str, count: int) -> SourceLines:
    try:
        blob = source.read_file(name)
    except OSError as e:
        raise DatasetError(f"{source.where(name)}: cannot read the sources sidecar ({e.strerror or e})") from None
    try:
        return parse_sources(blob, count)
    except SidecarError as e:
        raise DatasetError(f"{source.where(name)}: {e}; rerun 'imgpipe pack'") from None


# ---------------------------------------------------------------------- opening


def open_shardset(path: PathLike | Sequence[PathLike], split: str = "train") -> ShardSet:
    """Open a packed folder (with manifest.json) at a path or a URL, or bare .rec files with their .idx (path, list or glob).

    A URL (``s3://bucket/prefix``, ``gs://``, ``az://``, ``http(s)://``) must hold a packed folder;
    its index and sidecars are read once, here, concurrently. In a local folder
    without a manifest only file names decide the split: ``{split}-NNNNN-of-NNNNN.rec`` or
    ``{split}.rec`` (im2rec's prefix). Given files or a glob, every file given is read as
    ``split``, and a shard named for another split is an error (a ``*.rec`` glob would mix them).
    A node cache in front of a URL is ``imgpipe.open_shards`` (``imgpipe.cache.opening``).
    """
    if is_url(path):
        return open_url(open_source(path), split)  # type: ignore[arg-type]
    if isinstance(path, (str, os.PathLike)) and Path(path).is_dir():
        if os.path.lexists(manifest_path(path)):  # one that is not a regular file is load_manifest's line, as in verify
            return open_packed(Path(path), split)
        unfinished = incomplete_folder(path)
        if unfinished is not None:
            raise DatasetError(unfinished)
        return _open_bare(_split_files(Path(path), split), split)
    recs = _expand(path)
    other = next((rec for rec in recs if SHARD_FILE.match(rec.name) and _split_of(rec) != split), None)
    if other is not None:
        named = _split_of(other)
        raise DatasetError(
            f"{other}: a shard of split {named!r}, opened as split {split!r}; give only that split's files and split={named!r}"
        )
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
    if any(is_url(item) for item in items):
        raise DatasetError(f"{next(item for item in items if is_url(item))}: a URL is read as a packed folder; give the folder's URL alone")
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


def open_packed(folder: Path, split: str) -> ShardSet:
    """A split of a local packed folder (one with its manifest)."""
    manifest: Manifest = load_manifest(folder)
    info = _split_info(manifest, split, manifest_path(folder))
    recs = [folder / s.name for s in info.shards]
    if info.index_sidecar:
        sizes = [_shard_size(rec) for rec in recs]
        sidecar = folder / info.index_sidecar
        shard, offsets, ends, keys = sidecar_index(_read_local(sidecar, "index sidecar"), info, sizes, sidecar)
    else:
        shard, offsets, ends, keys = _index_arrays(
            _local_indexes(recs, [folder / s.index for s in info.shards]), [s.records for s in info.shards]
        )
    labels = _labels(_read_local(folder / info.labels, "labels sidecar"), folder / info.labels, len(offsets), len(manifest.classes))
    return ShardSet(
        LocalSource(folder),
        [s.name for s in info.shards],
        shard,
        offsets,
        ends,
        keys,
        split=split,
        labels=labels,
        classes=list(manifest.classes),
        sources_name=info.sources,
    )


def _open_bare(recs: list[Path], split: str) -> ShardSet:
    shard, offsets, ends, keys = _index_arrays(_local_indexes(recs, [rec.with_suffix(".idx") for rec in recs]), None)
    return ShardSet(LocalSource(None), [str(rec) for rec in recs], shard, offsets, ends, keys, split=split)


ReaderFactory = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], ByteSource]


def open_url(
    source: ByteSource,
    split: str,
    *,
    fetched: tuple[bytes, Manifest] | None = None,
    read_files: Callable[[list[str]], list[bytes]] | None = None,
    reader: ReaderFactory | None = None,
) -> ShardSet:
    """A packed folder at a URL: the manifest (unless ``fetched``), then the index (its sidecar, or every
    .idx of an older pack), the labels and the crc32 sidecar in one concurrent fetch. A cache in front of
    the URL passes ``read_files`` (the index files, from the cache where it holds them) and ``reader``
    (the records' byte source, from the offsets, ends and crc32s)."""
    manifest = (fetched or fetch_manifest(source))[1]
    info = _split_info(manifest, split, source.where(MANIFEST_NAME))
    names = index_files(info) + [info.labels] + ([info.checksums] if info.checksums else [])
    try:
        blobs = (read_files or source.read_files)(names)
    except FileNotFoundError as e:
        raise DatasetError(f"{e}: the manifest lists it; run 'imgpipe verify {source.location}'") from None
    count, index_count = info.records, len(index_files(info))
    labels = _labels(blobs[index_count], source.where(info.labels), count, len(manifest.classes))
    checksums = None
    if info.checksums:
        try:
            checksums = parse_checksums(blobs[-1], count)
        except SidecarError as e:
            raise DatasetError(f"{source.where(info.checksums)}: {e}; rerun 'imgpipe pack'") from None
    del blobs[index_count:]
    shard, offsets, ends, keys = split_index(source.where, blobs, info)
    byte_source = reader(offsets, ends, checksums) if reader is not None else source
    return ShardSet(
        byte_source,
        [s.name for s in info.shards],
        shard,
        offsets,
        ends,
        keys,
        split=split,
        labels=labels,
        classes=list(manifest.classes),
        sources_name=info.sources,
        checksums=checksums,
        shard_bytes=[s.bytes for s in info.shards],
    )


def index_files(info: SplitInfo) -> list[str]:
    """The files that hold a split's index: its index sidecar, or (in packs made before it) every .idx."""
    return [info.index_sidecar] if info.index_sidecar else [s.index for s in info.shards]


def split_index(where: Callable[[str], str], blobs: list[bytes], info: SplitInfo) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(shard number, offset, end, key) of every record of a split, from the bytes of its
    ``index_files`` in order (``blobs`` is emptied as they are parsed); ``where(name)`` names a file in errors."""
    if info.index_sidecar:
        return sidecar_index(blobs.pop(), info, [s.bytes for s in info.shards], where(info.index_sidecar))
    return _index_arrays(_remote_indexes(where, blobs, info), [s.records for s in info.shards])


def sidecar_index(data: bytes, info: SplitInfo, sizes: list[int], where: object) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``split_index`` from the split's index sidecar, each shard's records ending at ``sizes``."""
    try:
        keys, offsets = parse_index_sidecar(data, info.records)
    except SidecarError as e:
        raise DatasetError(f"{where}: {e}; run 'imgpipe verify' on its folder") from None
    counts = np.array([s.records for s in info.shards], dtype=np.int64)
    shard = np.repeat(np.arange(len(info.shards), dtype=np.int32), counts)
    size = np.repeat(np.asarray(sizes, dtype=np.int64), counts)
    past = offsets >= size
    if past.any():
        k = int(np.argmax(past))
        raise DatasetError(
            f"{where}: record {k}: offset {int(offsets[k])} is past the end of {info.shards[shard[k]].name} ({int(size[k])} bytes); "
            "run 'imgpipe verify' on its folder"
        )
    last = np.cumsum(counts) - 1  # each shard's last record
    ends = np.empty_like(offsets)
    ends[:-1] = offsets[1:]
    ends[last[counts > 0]] = np.asarray(sizes, dtype=np.int64)[counts > 0]
    if not bool(np.all(ends > offsets)):  # records out of file order within a shard (an index not written by imgpipe)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        ends = np.concatenate([_record_ends(offsets[a:b], n) for a, b, n in zip(bounds[:-1], bounds[1:], sizes)])
    return shard, offsets, ends, keys


def _split_info(manifest: Manifest, split: str, where: object) -> SplitInfo:
    if split not in manifest.splits:
        raise DatasetError(f"{where}: no split {split!r} (it has {', '.join(sorted(manifest.splits)) or 'none'})")
    return manifest.splits[split]


IndexPart = tuple[np.ndarray, np.ndarray, int, str, str]  # keys, offsets, .rec size, .idx and .rec as shown


def _shard_size(rec: Path) -> int:
    try:
        return rec.stat().st_size
    except FileNotFoundError:
        raise DatasetError(f"{rec}: shard is missing; run 'imgpipe verify' on its folder") from None


def _local_indexes(recs: list[Path], idxs: list[Path]) -> Iterator[IndexPart]:
    """Each local .idx parsed, one at a time, with its shard's size."""
    for rec, idx in zip(recs, idxs):
        if not rec.is_file():
            raise DatasetError(f"{rec}: shard is missing; run 'imgpipe verify' on its folder")
        if not idx.is_file():
            raise DatasetError(f"{idx}: index is missing for {rec.name}; rebuild it (im2rec --pack-label or 'imgpipe pack')")
        try:
            key, offset = recordio.read_index(idx)
        except RecordIOError as e:
            raise DatasetError(str(e)) from None
        yield key, offset, rec.stat().st_size, str(idx), rec.name


def _remote_indexes(where: Callable[[str], str], blobs: list[bytes], info: SplitInfo) -> Iterator[IndexPart]:
    """Each fetched .idx parsed, one at a time (its text dropped once parsed), with the manifest's shard size."""
    blobs.reverse()
    for shard in info.shards:
        try:
            key, offset = recordio.parse_index(blobs.pop(), where(shard.index))
        except RecordIOError as e:
            raise DatasetError(str(e)) from None
        yield key, offset, shard.bytes, where(shard.index), shard.name


def _index_arrays(indexes: Iterable[IndexPart], expected: list[int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every shard's index as (shard number, offset, end, key) arrays, one entry per record.

    Each shard's arrays are copied into the outputs as soon as it is read, so the peak is the
    outputs plus one shard's index, not twice the whole index.
    """
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for number, (key, offset, size, idx, rec) in enumerate(indexes):
        if expected is not None and key.size != expected[number]:
            raise DatasetError(f"{idx}: {key.size} records, the manifest says {expected[number]}; run 'imgpipe verify'")
        if offset.size and offset.max() >= size:
            raise DatasetError(f"{idx}: offset {int(offset.max())} is past the end of {rec} ({size} bytes); rebuild the index")
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


def _read_local(path: Path, what: str) -> bytes:
    try:
        return read_regular(path)
    except FileNotFoundError:
        raise DatasetError(f"{path}: {what} is missing; rerun 'imgpipe pack'") from None
    except OSError as e:
        raise DatasetError(f"{path}: unreadable {what} ({e}); rerun 'imgpipe pack'") from None


def _labels(data: bytes, where: object, count: int, classes: int) -> np.ndarray:
    try:
        return parse_labels(data, count, classes)
    except SidecarError as e:
        record = "" if e.record is None else f"record {e.record}: "
        raise DatasetError(f"{where}: {record}{e}; rerun 'imgpipe pack'") from None
