"""The one reader and writer per sidecar: round trips, and the checks both ShardSet and verify get."""

from __future__ import annotations

import io
import tracemalloc
from collections import Counter
from functools import partial
from typing import Callable

import numpy as np
import pytest

from imgpipe.format import files
from imgpipe.format.files import SidecarError, parse_checksums, parse_index_sidecar, parse_labels, parse_sources


def test_names_of_shards_and_sidecars() -> None:
    assert files.shard_stem("train", 3, 12) == "train-00003-of-00012"
    assert files.is_shard_file("train-00003-of-00012.rec") and files.is_shard_file("val-00000-of-00001.idx")
    assert not files.is_shard_file("train-00003-of-00012.json") and not files.is_shard_file("train.rec")
    names = (files.sources_name("val"), files.labels_name("val"), files.checksums_name("val"), files.index_name("val"))
    assert names == ("val.sources.txt", "val.labels.npy", "val.crc32.npy", "val.index.npy")
    assert all(name.endswith(files.SIDECAR_SUFFIXES) for name in names)


def test_writers_and_readers_round_trip() -> None:
    paths = ["a/x.JPEG", "b/caf\udce9.jpg", "c/with\rreturn.jpg"]
    assert list(parse_sources(files.sources_bytes(paths), 3)) == paths
    labels = np.array([0, 3, 1])
    assert parse_labels(files.labels_bytes(labels), 3, 4).tolist() == [0, 3, 1]
    crcs = np.array([0, 0xFFFFFFFF, 7], dtype=np.uint32)
    assert parse_checksums(files.checksums_bytes(crcs), 3).tolist() == crcs.tolist()
    assert len(parse_sources(b"a\nb", 2)) == 2 and len(parse_sources(b"", 0)) == 0
    keys, offsets = parse_index_sidecar(files.index_bytes(np.array([5, 9, 2]), np.array([0, 4096, 1 << 40])), 3)
    assert keys.dtype == offsets.dtype == np.int64
    assert keys.tolist() == [5, 9, 2] and offsets.tolist() == [0, 4096, 1 << 40]


@pytest.mark.parametrize(
    "data,message",
    [
        (files.index_bytes(np.arange(2), np.arange(2)), r"holds a \(2, 2\) array, expected \(2, 3\)"),
        (files._npy_bytes(np.zeros((3, 2), np.int64)), r"holds a \(3, 2\) array"),
        (files._npy_bytes(np.zeros(6, np.int64)), "must be a 2-D integer array"),
        (files._npy_bytes(np.asfortranarray(np.zeros((2, 3), np.int64))), "Fortran order"),
        (files.index_bytes(np.arange(3), np.array([0, -8, 16])), "record 1: negative offset -8"),
        (files._npy_bytes(np.array([[0, 1, 2], [0, 2**64 - 16, 16]], np.uint64)), "record 1: offset 18446744073709551600 is beyond"),
        (files._npy_bytes(np.array([[0, 2**63, 2], [0, 8, 16]], np.uint64)), "record 1: key 9223372036854775808 is beyond"),
    ],
)
def test_a_bad_index_sidecar_is_one_error(data: bytes, message: str) -> None:
    with pytest.raises(SidecarError, match=message):
        parse_index_sidecar(data, 3)


@pytest.mark.parametrize(
    "parse,shape",
    [(partial(parse_labels, count=1 << 31, classes=4), (1 << 31,)), (partial(parse_index_sidecar, count=1 << 30), (2, 1 << 30))],
)
def test_a_header_that_claims_more_than_follows_allocates_nothing(parse: Callable[[bytes], object], shape: tuple[int, ...]) -> None:
    """A .npy header is a length field: its shape is checked against the bytes after it before any array exists."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": shape})
    tracemalloc.start()
    try:
        with pytest.raises(SidecarError, match="but 16 bytes follow it"):
            parse(header.getvalue() + bytes(16))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # numpy's own np.load would ask for 16 GiB here


@pytest.mark.parametrize(
    "data,message,record",
    [
        (files.labels_bytes(np.zeros(2)), "holds 2 values, the manifest counts 3 records", None),
        (files._npy_bytes(np.zeros(3, np.float32)), "must be a 1-D integer array, got float32", None),
        (files._npy_bytes(np.zeros((3, 1), np.int32)), "must be a 1-D integer array", None),
        (b"not npy", "not a readable .npy file", None),
        (files.labels_bytes(np.array([0, 1, 4])), "label 4 is outside 0..3", 2),
    ],
)
def test_a_bad_labels_sidecar_is_one_error(data: bytes, message: str, record: int | None) -> None:
    with pytest.raises(SidecarError, match=message) as info:
        parse_labels(data, 3, 4)
    assert info.value.record == record


def test_a_short_sources_sidecar_is_one_error() -> None:
    with pytest.raises(SidecarError, match="2 lines, the manifest counts 3 records"):
        parse_sources(b"a\nb\n", 3)


def test_every_flipped_bit_of_a_labels_header_is_a_sidecar_error_or_reads_the_same_labels() -> None:
    """Damage anywhere in the .npy header (numpy parses it with literal_eval) is one SidecarError, never another
    exception, and never other labels read as if nothing happened."""
    labels = np.arange(12) % 4
    data = files.labels_bytes(labels)
    outcomes: Counter[str] = Counter()
    for position in range(len(data) - 4 * labels.size):  # the magic, the version and the header, not the values
        for bit in range(8):
            damaged = bytearray(data)
            damaged[position] ^= 1 << bit
            try:
                read = parse_labels(bytes(damaged), 12, 4)
            except SidecarError:
                outcomes["refused"] += 1
            else:
                assert read.tolist() == labels.tolist(), (position, bit)
                outcomes["same"] += 1
    assert outcomes["refused"] > 1000 and outcomes["same"] > 0, outcomes  # both happen (a few flips change nothing numpy reads)
