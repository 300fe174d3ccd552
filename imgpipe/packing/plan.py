"""The pack plan: which source item goes into which shard, as a pure function of the options.

Per split, items come in the scanner's order, optionally permuted with
``numpy.random.default_rng([seed, split_index])``, and are cut into contiguous shards whose item counts
differ by at most one; an item's position in that order is its record id. The shard count is
``--shards``, else the source bytes (plus framing) over ``--shard-size``: output sizes are known only
after decoding, and the plan must come first, since resuming and multi-node packs rest on it. Nothing
here depends on the number of workers or machines. An item that can never be packed (a file that is not
a regular file, or too large for a record) is left out of the plan unread, with its reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from imgpipe._sys.fiemap import UNSUPPORTED, first_extent
from imgpipe.errors import PackError
from imgpipe.format.files import shard_stem
from imgpipe.format.recordio import FRAME_HEADER, IR_SIZE, MAX_RECORD_BYTES
from imgpipe.ingest.filekinds import mode_reason
from imgpipe.ingest.folders import warn_left_out
from imgpipe.packing.filereads import opens_are_round_trips

if TYPE_CHECKING:
    from imgpipe.ingest.members import MemberSpans
    from imgpipe.ingest.streams import StreamItems

logger = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = "256MB"
RECORD_OVERHEAD = FRAME_HEADER.size + IR_SIZE + 3  # frame header, IRHeader, worst-case padding
NOWHERE = 2**63 - 1  # the place of a file with no data on the disk: read after the others
_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "KB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "T": 10**12,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text: str) -> int:
    """Parse "256MB", "2MB", "1GiB", "1.5G" or a plain byte count into bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise PackError(f"--shard-size {text!r} is not a size: use e.g. 256MB, 2MB or 1GiB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise PackError(f"--shard-size {text!r} must be larger than 0")
    return value


def parse_shard_counts(text: str | int | None, splits: Sequence[str]) -> dict[str, int] | None:
    """Parse ``--shards``: "N" for every split or "train=1024,val=64"; None if not given."""
    if text is None or text == "":
        return None
    text = str(text)
    counts: dict[str, int] = {}
    try:
        if "=" not in text:
            counts = {split: int(text) for split in splits}
        else:
            for part in text.split(","):
                name, _, value = part.partition("=")
                counts[name.strip()] = int(value)
    except ValueError:
        raise PackError(f"--shards {text!r} is not a count: use e.g. 64 or train=1024,val=64") from None
    unknown = sorted(set(counts) - set(splits))
    missing = sorted(set(splits) - set(counts))
    if unknown or missing:
        what = f"names unknown split(s) {unknown}" if unknown else f"gives no count for split(s) {missing}"
        raise PackError(f"--shards {text!r} {what}; the source has splits {list(splits)}")
    bad = [name for name, n in counts.items() if n < 1]
    if bad:
        raise PackError(f"--shards {text!r}: split {bad[0]} needs at least 1 shard")
    return counts


@dataclass(frozen=True)
class ShardSpec:
    """One planned shard: split positions [start, stop) of the planned order."""

    split: str
    number: int
    count: int
    start: int
    stop: int

    @property
    def name(self) -> str:
        return shard_stem(self.split, self.number, self.count)

    @property
    def items(self) -> int:
        return self.stop - self.start

    @property
    def rec_name(self) -> str:
        return f"{self.name}.rec"

    @property
    def idx_name(self) -> str:
        return f"{self.name}.idx"


@dataclass
class SplitPlan:
    """A split's planned order (``paths[k]``/``labels[k]`` is the item with record id k) and its shards."""

    name: str
    paths: list[str]
    labels: np.ndarray
    sizes: np.ndarray
    shards: list[ShardSpec]
    spans: MemberSpans | StreamItems | None = None  # archive sources: where each planned item lies
    places: np.ndarray | None = None  # files: where each lies (disk offset or inode: source_stats), the read order; not fingerprinted


@dataclass
class PackPlan:
    """The whole plan: classes, splits in order, the options that shaped it and a fingerprint."""

    classes: list[str]
    splits: dict[str, SplitPlan]
    options: dict[str, Any]
    fingerprint: str
    rejected: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # split -> (path, reason) left out unread
    layout: str = ""  # the source layout the scan read (source.SourceTree.layout)

    @property
    def shards(self) -> list[ShardSpec]:
        """Every shard of every split, in split then shard order (the global shard list)."""
        return [shard for split in self.splits.values() for shard in split.shards]


def source_stats(root: Path, paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """Byte size of each source file (0 where it vanished), where it lies (the order pack reads them in), and
    by index why a file that is not a regular file (a device, a FIFO) is never read.

    On a disk whose file system says where a file's data is (ext4, xfs, btrfs: FIEMAP), a file's
    place is that disk offset (``NOWHERE``, after all others, for one with no data there);
    elsewhere (tmpfs; a network or FUSE file system, where an open is a round trip) its inode
    number, which local file systems allocate in about the order they lay files out. One stat per
    file, and an open of each regular file with data where FIEMAP answers.
    """
    sizes, inodes, offsets = np.zeros(len(paths), np.int64), np.zeros(len(paths), np.int64), np.full(len(paths), NOWHERE, np.int64)
    irregular: dict[int, str] = {}
    base = os.path.join(os.fspath(root), "")  # plain strings: a Path per file costs more than its stat
    placed = len(paths) > 0 and not opens_are_round_trips(root)
    for k, rel in enumerate(paths):
        try:
            info = os.stat(base + rel)
        except OSError:
            continue
        reason = mode_reason(info.st_mode)
        if reason is not None:  # never opened: opening a FIFO or a device is not without effects
            irregular[k] = reason
            continue
        sizes[k], inodes[k] = info.st_size, info.st_ino
        if placed and info.st_size:
            try:
                offsets[k] = _first_extent_of(base + rel)
            except OSError as e:
                placed = e.errno not in UNSUPPORTED  # this file cannot be opened (its place stays unknown), or none here can say
    return sizes, offsets if placed else inodes, irregular


def too_large(size: int) -> str:
    """Why an item of ``size`` bytes is never read: its record would not fit RecordIO's length field."""
    return (f"too large for a RecordIO record ({size:,} bytes; a record holds under {MAX_RECORD_BYTES >> 20} MiB with its header): "
            "not read; shrink it")  # fmt: skip


def _first_extent_of(path: str) -> int:
    """Where the regular file's data starts on the disk, or ``NOWHERE``; opened ``O_NONBLOCK``, to read nothing."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        offset = first_extent(fd)
    finally:
        os.close(fd)
    return NOWHERE if offset is None else offset


def make_plan(
    root: Path,
    classes: Sequence[str],
    split_items: Mapping[str, tuple[Sequence[str], np.ndarray]],
    *,
    options: Mapping[str, Any],
    shard_size: int,
    shard_counts: Mapping[str, int] | None,
    shuffle: bool,
    seed: int,
    spans: Mapping[str, MemberSpans | StreamItems] | None = None,
) -> PackPlan:
    """Order, shuffle and cut every split into shards; fingerprint the result.

    A split in ``spans`` lies inside archives: its sizes are the members' (no stat), and its
    spans are planned with it. The fingerprint does not depend on where the bytes lie. Items that can
    never be packed are left out, each in ``PackPlan.rejected`` with its reason.
    """
    splits: dict[str, SplitPlan] = {}
    rejected: dict[str, list[tuple[str, str]]] = {}
    digest = hashlib.sha256(json.dumps({"options": dict(options), "classes": list(classes)}, sort_keys=True).encode())
    for split_index, (name, (paths, labels)) in enumerate(split_items.items()):
        labels = np.asarray(labels, dtype=np.int32)
        split_spans = (spans or {}).get(name)
        sizes, places, unread = (split_spans.sizes, None, {}) if split_spans is not None else source_stats(root, paths)
        unread.update((k, too_large(int(sizes[k]))) for k in np.flatnonzero(sizes + IR_SIZE >= MAX_RECORD_BYTES).tolist())
        if unread:
            rejected[name] = [(paths[k], unread[k]) for k in sorted(unread)]
            for path, reason in rejected[name]:
                warn_left_out(root, path, reason)
            keep = np.setdiff1d(np.arange(len(paths)), np.fromiter(unread, np.int64))
            paths, labels, sizes = [paths[k] for k in keep.tolist()], labels[keep], sizes[keep]
            places = places[keep] if places is not None else None
            split_spans = split_spans.take(keep) if split_spans is not None else None
        order = np.random.default_rng([seed, split_index]).permutation(len(paths)) if shuffle else np.arange(len(paths))
        planned_paths = [paths[k] for k in order.tolist()]
        planned_labels = labels[order]
        estimated = int(sizes.sum()) + RECORD_OVERHEAD * len(paths)
        if shard_counts is not None:
            count = shard_counts[name]
        else:
            count = max(1, math.ceil(estimated / shard_size))
        if 0 < len(paths) < count:
            asked = f"--shards {count}" if shard_counts is not None else f"--shard-size {shard_size:,} B ({count} shards)"
            logger.warning("split %s: %s but only %d image(s): writing %d shard(s) of one image", name, asked, len(paths), len(paths))
        count = max(1, min(count, len(paths)))
        bounds = [len(paths) * k // count for k in range(count + 1)]
        shards = [ShardSpec(name, k, count, bounds[k], bounds[k + 1]) for k in range(count)]
        planned_spans = split_spans.take(order) if split_spans is not None else None
        planned_places = places[order] if places is not None else None
        splits[name] = SplitPlan(name, planned_paths, planned_labels, sizes[order], shards, planned_spans, planned_places)
        digest.update(name.encode() + b"\0")
        digest.update("\n".join(planned_paths).encode("utf-8", "surrogateescape"))
        digest.update(planned_labels.astype("<i4").tobytes())
        digest.update(sizes[order].astype("<i8").tobytes())
        digest.update(json.dumps(bounds).encode())
    return PackPlan(list(classes), splits, dict(options), digest.hexdigest(), rejected)


def published_names(split: SplitPlan, records: Sequence[int]) -> dict[str, str]:
    """Planned shard name -> the name it is published under, given each shard's record count.

    A shard whose every item was skipped is not published (it is absent from the result: an
    empty .rec cannot be mapped by DALI), and the others are renumbered so that
    ``-of-N`` is the number of files. Without empty shards every name stays as planned.
    """
    kept = [spec for spec, n in zip(split.shards, records) if n > 0]
    return {spec.name: replace(spec, number=j, count=len(kept)).name for j, spec in enumerate(kept)}
