"""``imgpipe verify``: is a packed folder complete and intact? Every problem is located.

With a manifest each shard is held to it (size and sha256, every record's framing, the ``.idx`` against
the record starts and the IRHeader ids, labels and crc32s against their sidecars; ``decode=True`` also
decodes every image with Pillow); bare .rec/.idx pairs get the framing and index checks; a writer's
journal without a manifest is one problem. A URL's shards are downloaded and checked as local ones.
A problem reads ``file: record K (offset O, source S): what``, K the record's index in its split.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from imgpipe._sys.checksum import crc32, sha256_file
from imgpipe._sys.cpus import available_cpus
from imgpipe._sys.oserrors import describe
from imgpipe._sys.procs import map_in_processes
from imgpipe._sys.regular import open_regular
from imgpipe.errors import ConfigError, DatasetError, RecordIOError
from imgpipe.format.files import SidecarError, parse_checksums, parse_index_sidecar, parse_labels, parse_sources
from imgpipe.format.manifest import MANIFEST_NAME, Manifest, ShardInfo, load_manifest, read_manifest, stays_inside_source_root
from imgpipe.format.recordio import IRHeader, iter_frames, read_index, unpack_header
from imgpipe.format.unfinished import incomplete_folder
from imgpipe.image.codec import decode_failure
from imgpipe.storage.local import LocalSource
from imgpipe.storage.opening import open_source
from imgpipe.storage.source import ByteSource, is_url

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_PROBLEMS_PER_SHARD = 100


@dataclass(frozen=True)
class Problem:
    """One thing wrong, and where."""

    file: str
    message: str
    record: int | None = None
    offset: int | None = None
    source: str | None = None

    def __str__(self) -> str:
        where = []
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.source is not None:
            where.append(f"source {self.source}")
        location = ""
        if self.record is not None:
            location = f" record {self.record}" + (f" ({', '.join(where)})" if where else "")
        elif where:
            location = f" {', '.join(where)}"
        return f"{self.file}:{location}: {self.message}" if location else f"{self.file}: {self.message}"


@dataclass
class VerifyReport:
    """The result of a verify run; ``ok`` only when the dataset is complete and intact."""

    path: Path | str  # a local path, or a URL
    problems: list[Problem] = field(default_factory=list)
    shards: int = 0
    records: int = 0
    bytes: int = 0
    decoded: bool = False
    options: dict[str, Any] | None = None  # the manifest's pack options; None for bare .rec files

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        checks = "checked" + (" and decoded" if self.decoded else "")
        state = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        return f"{self.path}: {state}: {checks} {self.records:,} records in {self.shards} shard(s), {self.bytes / 1e6:,.1f} MB"


@dataclass(frozen=True)
class ShardCheck:
    """One shard to check (plain data for a worker process)."""

    rec: Path
    idx: Path
    expected: ShardInfo | None = None  # None for a bare pair
    first_record: int = 0
    labels: np.ndarray | None = None
    crc32: np.ndarray | None = None
    sources: Sequence[str] | None = None
    num_classes: int | None = None
    decode: bool = False
    remote: str | None = None  # the folder's URL: ``rec`` and ``idx`` are names in it
    sidecar_index: tuple[str, np.ndarray, np.ndarray] | None = None  # the index sidecar's name, and its keys and offsets of this shard


@dataclass
class ShardOutcome:
    problems: list[Problem]
    records: int
    bytes: int


def verify(dst: str | os.PathLike, *, decode: bool = False, workers: int | None = None, progress: bool = True) -> VerifyReport:
    """Check a packed folder, or a bare .rec (or a folder of them); see the module docstring."""
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers}: need at least 1")
    if is_url(dst):
        return _verify_remote(str(dst).rstrip("/"), decode, workers, progress)
    path = Path(dst)
    if path.name == MANIFEST_NAME and path.is_file():
        path = path.parent
    report = VerifyReport(path=path, decoded=decode)
    if path.is_dir() and (path / MANIFEST_NAME).exists():
        manifest = load_manifest(path)
        report.options = manifest.options
        checks = _manifest_checks(LocalSource(path), manifest, decode, report.problems)
        report.problems += _stray_shards(LocalSource(path).list_names() or [], manifest)
    elif path.is_file() and path.suffix == ".rec":
        checks = [ShardCheck(path, path.with_suffix(".idx"), decode=decode)]
    elif path.is_dir() and (unfinished := incomplete_folder(path)) is not None:
        report.problems.append(Problem(str(path), unfinished.partition(": ")[2]))
        return report
    elif path.is_dir():
        recs = sorted(path.glob("*.rec"))
        if not recs:
            raise DatasetError(f"{path}: no {MANIFEST_NAME} and no .rec files; give a folder made by 'imgpipe pack' or a .rec file")
        checks = [ShardCheck(rec, rec.with_suffix(".idx"), decode=decode) for rec in recs]
    else:
        what = "not a .rec file" if path.exists() else "not found"
        raise DatasetError(f"{path}: {what}; give a folder made by 'imgpipe pack', or a .rec file")
    return _check_all(report, checks, workers, progress)


def _verify_remote(url: str, decode: bool, workers: int | None, progress: bool) -> VerifyReport:
    """A packed folder at a URL: its sidecars fetched here, each shard downloaded by the worker that checks it."""
    source = open_source(url)
    report = VerifyReport(path=url, decoded=decode)
    manifest = read_manifest(source)
    report.options = manifest.options
    checks = [dataclasses.replace(check, remote=url) for check in _manifest_checks(source, manifest, decode, report.problems)]
    names = source.list_names()  # None where the store cannot list (plain HTTP): strays go unseen
    report.problems += _stray_shards(names or [], manifest)
    return _check_all(report, checks, workers, progress)


def _check_all(report: VerifyReport, checks: list[ShardCheck], workers: int | None, progress: bool) -> VerifyReport:
    for outcome in _run(checks, workers, progress):
        report.problems += outcome.problems
        report.records += outcome.records
        report.bytes += outcome.bytes
        report.shards += 1
    return report


def _manifest_checks(source: ByteSource, manifest: Manifest, decode: bool, problems: list[Problem]) -> list[ShardCheck]:
    """Check the sidecars of every split; return the shard checks (``rec`` and ``idx`` as the source names them)."""
    checks = []
    classes = len(manifest.classes)
    folder = source.root if isinstance(source, LocalSource) and source.root is not None else Path()
    for split in manifest.splits.values():
        total = split.records
        sources = _load_sources(source, split.sources, split.sources_sha256, total, problems)
        labels = _load_sidecar(
            source, split.labels, split.labels_sha256, problems, lambda data, total=total: parse_labels(data, total, classes)
        )
        crcs = index = None
        if split.checksums:
            crcs = _load_sidecar(
                source, split.checksums, split.checksums_sha256, problems, lambda data, total=total: parse_checksums(data, total)
            )
        if split.index_sidecar:
            index = _load_sidecar(
                source,
                split.index_sidecar,
                split.index_sidecar_sha256,
                problems,
                lambda data, total=total: parse_index_sidecar(data, total),
            )
        first = 0
        for shard in split.shards:
            stop = first + shard.records
            checks.append(
                ShardCheck(
                    rec=folder / shard.name,
                    idx=folder / shard.index,
                    expected=shard,
                    first_record=first,
                    labels=None if labels is None else labels[first:stop],
                    crc32=None if crcs is None else crcs[first:stop],
                    sources=None if sources is None else sources[first:stop],
                    num_classes=classes,
                    decode=decode,
                    sidecar_index=None if index is None else (split.index_sidecar, index[0][first:stop], index[1][first:stop]),
                )
            )
            first = stop
    return checks


def _stray_shards(names: list[str], manifest: Manifest) -> list[Problem]:
    """A .rec/.idx in a packed folder (its file ``names``) that the manifest does not list: left from another pack."""
    listed = {name for split in manifest.splits.values() for shard in split.shards for name in (shard.name, shard.index)}
    strays = sorted(name for name in names if name.endswith((".rec", ".idx")) and name not in listed)
    return [
        Problem(name, f"not listed in {MANIFEST_NAME} (left from another pack?); remove it, or repack with --overwrite") for name in strays
    ]


def _read_sidecar(source: ByteSource, name: str, sha: str, problems: list[Problem], what: str = "sidecar") -> bytes | None:
    """A sidecar's bytes, its checksum compared with the manifest's; None when it is missing."""
    try:
        data = source.read_file(name)
    except FileNotFoundError:
        problems.append(Problem(name, f"missing {what}"))
        return None
    except OSError as e:
        problems.append(Problem(name, f"cannot read the {what}: {describe(e, writing=False)}"))
        return None
    if hashlib.sha256(data).hexdigest() != sha:
        problems.append(Problem(name, "sha256 differs from the manifest"))
    return data


def _load_sources(source: ByteSource, name: str, sha: str, count: int, problems: list[Problem]) -> list[str] | None:
    lines = _load_sidecar(source, name, sha, problems, lambda data: list(parse_sources(data, count)), "sidecar of source paths")
    for number, line in enumerate(lines or [], start=1):
        if not stays_inside_source_root(line):
            problems.append(Problem(name, f"line {number}: source path {line!r} escapes the source folder"))
    return lines


def _load_sidecar(
    source: ByteSource, name: str, sha: str, problems: list[Problem], parse: Callable[[bytes], T], what: str = "sidecar"
) -> T | None:
    """A sidecar parsed by its reader in ``format.files``; None (and a problem) when it is missing or malformed."""
    data = _read_sidecar(source, name, sha, problems, what)
    if data is None:
        return None
    try:
        return parse(data)
    except SidecarError as e:
        problems.append(Problem(name, str(e), record=e.record))
        return None


# ----------------------------------------------------------------------------- running


def _run(checks: list[ShardCheck], workers: int | None, progress: bool) -> list[ShardOutcome]:
    workers = max(1, min(workers or available_cpus(), len(checks)))
    return list(map_in_processes(check_shard, checks, workers=workers, desc="verify", unit="shard", progress=progress))


# ----------------------------------------------------------------------------- one shard


def check_shard(check: ShardCheck) -> ShardOutcome:
    """Every check of one .rec/.idx pair; never raises for a broken or unreadable file (a remote store that fails is a ``RemoteError``)."""
    try:
        return _check_downloaded(check) if check.remote is not None else _check_shard(check)
    except OSError as e:  # a permission, a folder where the file should be, an I/O error: a finding like any other
        where = Path(e.filename).name if e.filename else check.rec.name
        return ShardOutcome([Problem(where, f"cannot read it: {describe(e, writing=False)}")], 0, 0)


def _check_shard(check: ShardCheck) -> ShardOutcome:
    name = check.rec.name
    problems: list[Problem] = []
    expected = check.expected
    if not check.rec.exists():
        what = f" ({expected.records} records, {expected.bytes} bytes expected)" if expected else ""
        return ShardOutcome([Problem(name, f"missing shard{what}")], 0, 0)
    for path in (check.rec, check.idx) if check.idx.exists() else (check.rec,):
        open_regular(path).close()  # a FIFO or a device there is a finding (check_shard's), never read
    size = check.rec.stat().st_size
    if expected is not None:
        if size != expected.bytes:
            problems.append(Problem(name, f"{size} bytes, the manifest says {expected.bytes} (truncated or changed)"))
        elif sha256_file(check.rec) != expected.sha256:
            problems.append(Problem(name, "sha256 differs from the manifest (the file changed since packing)"))
    starts, ids = _scan_records(check, problems)
    _check_index(check, starts, ids, problems)
    if expected is not None and len(starts) != expected.records:
        problems.append(Problem(name, f"{len(starts)} readable records, the manifest says {expected.records}"))
    elif not starts and not problems:
        problems.append(Problem(name, "empty shard: no records (DALI cannot map an empty file); repack, or remove it and its .idx"))
    if len(problems) > MAX_PROBLEMS_PER_SHARD:
        more = len(problems) - MAX_PROBLEMS_PER_SHARD
        problems = problems[:MAX_PROBLEMS_PER_SHARD] + [Problem(name, f"... and {more} more problem(s) in this shard")]
    return ShardOutcome(problems, len(starts), size)


def _check_downloaded(check: ShardCheck) -> ShardOutcome:
    """A remote shard and its index downloaded to a temporary folder, then checked as local files of the same names."""
    source = open_source(check.remote)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory(prefix="imgpipe-verify-") as tmp:
        local = dataclasses.replace(check, rec=Path(tmp) / check.rec.name, idx=Path(tmp) / check.idx.name, remote=None)
        for name, dest in ((check.rec.name, local.rec), (check.idx.name, local.idx)):
            try:
                source.download(name, dest)
            except FileNotFoundError:  # reported by the checks as a missing shard or index
                pass
        return _check_shard(local)


def _locate(check: ShardCheck, k: int) -> tuple[int, str | None]:
    """Split-wide record number and source path of the shard's k-th record."""
    source = check.sources[k] if check.sources is not None and k < len(check.sources) else None
    return check.first_record + k, source


def _scan_records(check: ShardCheck, problems: list[Problem]) -> tuple[list[int], list[int]]:
    """Walk the frames of the .rec; check each record; return record starts and IRHeader ids."""
    name = check.rec.name
    starts: list[int] = []
    ids: list[int] = []
    k = 0
    try:
        for offset, record in iter_frames(check.rec):
            starts.append(offset)
            number, source = _locate(check, k)
            try:
                header, payload = unpack_header(record, check.rec, offset)
            except RecordIOError as e:
                problems.append(Problem(name, e.problem, number, offset, source))
                ids.append(-1)
                k += 1
                continue
            if check.expected is not None and ids and int(header.id) <= ids[-1]:  # imgpipe ids increase; im2rec's need not
                problems.append(
                    Problem(name, f"IRHeader id {header.id} does not increase (previous record: {ids[-1]})", number, offset, source)
                )
            ids.append(int(header.id))
            for message in _record_problems(check, k, record, header, payload):
                problems.append(Problem(name, message, number, offset, source))
            k += 1
    except RecordIOError as e:
        number, source = _locate(check, k)
        problems.append(Problem(name, f"framing broken: {e.problem}", number, e.offset, source))
    return starts, ids


def _record_problems(check: ShardCheck, k: int, record: bytes, header: IRHeader, payload: bytes) -> list[str]:
    found = []
    if check.crc32 is not None and k < len(check.crc32) and crc32(record) != int(check.crc32[k]):
        found.append("checksum mismatch: the record's bytes changed since packing")
    if check.expected is not None:
        label = header.label
        if header.flag != 0:
            found.append(f"IRHeader flag {header.flag}: expected one scalar label")
        elif label != int(label) or not 0 <= label < (check.num_classes or 0):
            found.append(f"label {label} is not a class index in 0..{(check.num_classes or 0) - 1}")
        elif check.labels is not None and k < len(check.labels) and int(label) != int(check.labels[k]):
            found.append(f"label {int(label)} differs from the labels sidecar ({int(check.labels[k])})")
    if check.decode:
        error = decode_failure(payload)
        if error:
            found.append(f"image does not decode: {error}")
    return found


def _check_index(check: ShardCheck, starts: list[int], ids: list[int], problems: list[Problem]) -> None:
    """The .idx must list each record start once, in order, under the record's IRHeader id."""
    name = check.idx.name
    if not check.idx.exists():
        problems.append(Problem(name, "missing index file"))
        return
    if check.expected is not None:
        size = check.idx.stat().st_size
        if size != check.expected.index_bytes:
            problems.append(Problem(name, f"{size} bytes, the manifest says {check.expected.index_bytes}"))
        elif sha256_file(check.idx) != check.expected.index_sha256:
            problems.append(Problem(name, "sha256 differs from the manifest (the index changed since packing)"))
    try:
        keys, offsets = read_index(check.idx)
    except RecordIOError as e:
        problems.append(Problem(name, e.problem, offset=e.offset))
        return
    start_set = set(starts)
    for k, (key, offset) in enumerate(zip(keys.tolist(), offsets.tolist())):
        number, source = _locate(check, k)
        if k < len(starts) and offset == starts[k]:
            if key != ids[k] and ids[k] >= 0:
                problems.append(Problem(name, f"line {k + 1}: key {key} but the record's IRHeader id is {ids[k]}", number, offset, source))
        elif offset in start_set:
            problems.append(
                Problem(name, f"line {k + 1}: offset {offset} is the start of another record (out of order)", number, offset, source)
            )
        else:
            problems.append(Problem(name, f"line {k + 1}: offset {offset} is not the start of a record", number, offset, source))
    if len(keys) != len(starts):
        problems.append(Problem(name, f"{len(keys)} index lines for {len(starts)} records in {check.rec.name}"))
    if check.sidecar_index is not None:
        problems += _sidecar_differences(check, name, keys, offsets)


def _sidecar_differences(check: ShardCheck, idx_name: str, keys: np.ndarray, offsets: np.ndarray) -> list[Problem]:
    """The first line where the index sidecar says other than the shard's .idx (readers trust the one, MXNet the other)."""
    sidecar, sidecar_keys, sidecar_offsets = check.sidecar_index  # type: ignore[misc]
    if len(sidecar_keys) != len(keys):
        return [Problem(sidecar, f"{len(sidecar_keys)} entries for {idx_name}, which has {len(keys)} lines; rerun 'imgpipe pack'")]
    differ = np.flatnonzero((sidecar_keys != keys) | (sidecar_offsets != offsets))
    if not differ.size:
        return []
    k = int(differ[0])
    number, source = _locate(check, k)
    said = f"key {int(sidecar_keys[k])}, offset {int(sidecar_offsets[k])}"
    told = f"{idx_name} line {k + 1} says key {int(keys[k])}, offset {int(offsets[k])}"
    return [Problem(sidecar, f"{said} but {told}; rerun 'imgpipe pack'", number, None, source)]
