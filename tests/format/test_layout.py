"""The one reader and writer per sidecar: round trips, and the checks both ShardSet and verify get."""

from __future__ import annotations

import numpy as np
import pytest

from imgpipe.format import layout
from imgpipe.format.layout import SidecarError, parse_checksums, parse_labels, parse_sources


def test_names_of_shards_and_sidecars() -> None:
    assert layout.shard_stem("train", 3, 12) == "train-00003-of-00012"
    assert layout.is_shard_file("train-00003-of-00012.rec") and layout.is_shard_file("val-00000-of-00001.idx")
    assert not layout.is_shard_file("train-00003-of-00012.json") and not layout.is_shard_file("train.rec")
    names = (layout.sources_name("val"), layout.labels_name("val"), layout.checksums_name("val"))
    assert names == ("val.sources.txt", "val.labels.npy", "val.crc32.npy")
    assert all(name.endswith(layout.SIDECAR_SUFFIXES) for name in names)


def test_writers_and_readers_round_trip() -> None:
    paths = ["a/x.JPEG", "b/caf\udce9.jpg", "c/with\rreturn.jpg"]
    assert list(parse_sources(layout.sources_bytes(paths), 3)) == paths
    labels = np.array([0, 3, 1])
    assert parse_labels(layout.labels_bytes(labels), 3, 4).tolist() == [0, 3, 1]
    crcs = np.array([0, 0xFFFFFFFF, 7], dtype=np.uint32)
    assert parse_checksums(layout.checksums_bytes(crcs), 3).tolist() == crcs.tolist()
    assert len(parse_sources(b"a\nb", 2)) == 2 and len(parse_sources(b"", 0)) == 0


@pytest.mark.parametrize(
    "data,message,record",
    [
        (layout.labels_bytes(np.zeros(2)), "holds 2 values, the manifest counts 3 records", None),
        (layout._npy_bytes(np.zeros(3, np.float32)), "must be a 1-D integer array, got float32", None),
        (layout._npy_bytes(np.zeros((3, 1), np.int32)), "must be a 1-D integer array", None),
        (b"not npy", "not a readable .npy file", None),
        (layout.labels_bytes(np.array([0, 1, 4])), "label 4 is outside 0..3", 2),
    ],
)
def test_a_bad_labels_sidecar_is_one_error(data: bytes, message: str, record: int | None) -> None:
    with pytest.raises(SidecarError, match=message) as info:
        parse_labels(data, 3, 4)
    assert info.value.record == record


def test_a_short_sources_sidecar_is_one_error() -> None:
    with pytest.raises(SidecarError, match="2 lines, the manifest counts 3 records"):
        parse_sources(b"a\nb\n", 3)


def test_every_flipped_bit_of_a_labels_sidecar_is_a_sidecar_error_or_still_valid() -> None:
    """Damage anywhere in the .npy header (numpy parses it with literal_eval) is one SidecarError, never another exception."""
    data = layout.labels_bytes(np.arange(12) % 4)
    for position in range(128):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[position] ^= 1 << bit
            try:
                parse_labels(bytes(damaged), 12, 4)
            except SidecarError:
                pass
