"""Property: a sidecar's ``.npy`` header and a manifest's JSON, whatever they say, are read or refused as the
format's own error (``SidecarError``, one-line ``DatasetError``), never another exception, in bounded memory and
time: no shape, count or nesting read from them is trusted beyond the bytes that hold it."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from _bounded import allocated_by
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from imgpipe.errors import DatasetError
from imgpipe.format.files import SidecarError, index_bytes, labels_bytes, parse_checksums, parse_index_sidecar, parse_labels
from imgpipe.format.manifest import parse_manifest

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIMENSIONS = st.sampled_from([0, 1, 2, 3, 6, -1, -2, -3, -6]) | st.sampled_from([2**31, 2**63, 2**64 + 5]) | st.integers(-(2**70), 2**70)
DTYPES = st.sampled_from(["<i8", ">i8", "<u8", "<i4", "|u1", "<u4", "i8"]) | st.sampled_from(
    ["<f8", "|O", "|V8", "<m8", "S3", "b1", "<c16"]
)


def npy_header(header: dict, version_2: bool = False) -> bytes:
    buffer = io.BytesIO()
    try:
        (np.lib.format.write_array_header_2_0 if version_2 else np.lib.format.write_array_header_1_0)(buffer, header)
    except ValueError:  # a header too long for version 1.0
        np.lib.format.write_array_header_2_0(buffer, header)
    return buffer.getvalue()


@st.composite
def npy_files(draw: st.DrawFn) -> bytes:
    """A .npy header numpy writes (any shape, dtype, order, version), then a body of any length; or a valid file mangled."""
    if draw(st.booleans()):
        data = bytearray(draw(st.sampled_from([labels_bytes(np.arange(6)), index_bytes(np.arange(6), np.arange(6) * 32)])))
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(data) - 1))
            data[at] = draw(st.integers(0, 255))
        return bytes(data[: draw(st.integers(0, len(data)))])
    header = {"descr": draw(DTYPES), "fortran_order": draw(st.booleans()), "shape": tuple(draw(st.lists(DIMENSIONS, max_size=3)))}
    claimed = int(np.prod(header["shape"], dtype=object)) * np.dtype(header["descr"]).itemsize  # what the header says follows
    return npy_header(header, draw(st.booleans())) + bytes(draw(st.integers(0, 96) | st.just(claimed if 0 <= claimed <= 4096 else 0)))


@pytest.mark.timeout(120)
@FUZZ
@given(data=npy_files(), count=st.sampled_from([0, 1, 6, 2**40]))
@example(data=npy_header({"descr": "<i8", "fortran_order": False, "shape": (-2, -3)}) + bytes(48), count=6)  # reshape((-2, -3))
def test_any_npy_sidecar_is_read_or_a_sidecar_error(data: bytes, count: int) -> None:
    for parse in (lambda: parse_labels(data, count, 10), lambda: parse_checksums(data, count), lambda: parse_index_sidecar(data, count)):
        peak = allocated_by(parse, SidecarError)
        assert peak < len(data) + (64 << 10), f"read {len(data):,} bytes and allocated {peak:,}"


def manifest_dict() -> dict:
    shard = {"name": "train-00000-of-00001.rec", "index": "train-00000-of-00001.idx", "records": 6, "bytes": 4096,
             "sha256": "0" * 64, "index_bytes": 60, "index_sha256": "0" * 64}  # fmt: skip
    split = {"shards": [shard], "sources": "train.sources.txt", "sources_sha256": "0" * 64, "labels": "train.labels.npy",
             "labels_sha256": "0" * 64, "records": 6, "bytes": 4096}  # fmt: skip
    return {"format": "imgpipe-recordio", "version": 1, "classes": ["a", "b"], "splits": {"train": split}, "options": {},
            "source": "/data", "skipped": [{"split": "train", "path": "x.JPEG", "reason": "not an image"}]}  # fmt: skip


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
SHARD = ("splits", "train", "shards")
PATHS = st.sampled_from([(), ("classes",), ("splits",), SHARD[:2], SHARD, (*SHARD, 0), ("options",), ("skipped",), ("skipped", 0)])


@st.composite
def manifest_texts(draw: st.DrawFn) -> bytes:
    """A manifest with one of its values, anywhere, replaced by any JSON; or its text mangled (nesting, huge numbers, bytes)."""
    data = manifest_dict()
    kind = draw(st.sampled_from(["value", "value", "text", "deep", "digits"]))
    if kind == "deep":
        return b'{"format": "imgpipe-recordio", "version": 1, "classes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    if kind == "digits":
        return json.dumps(data).replace('"records": 6', '"records": ' + "7" * draw(st.integers(4000, 20_000))).encode()
    if kind == "value":
        node = data
        for key in draw(PATHS):
            node = node[key]
        if isinstance(node, dict) and node:
            node[draw(st.sampled_from(sorted(node)))] = draw(JSON_VALUES)
        elif isinstance(node, list) and node:
            node[0] = draw(JSON_VALUES)
        return json.dumps(data).encode()
    text = bytearray(json.dumps(data).encode())
    for _ in range(draw(st.integers(1, 4))):
        text[draw(st.integers(0, len(text) - 1))] = draw(st.integers(0, 255))
    return bytes(text)


@pytest.mark.timeout(120)
@FUZZ
@given(text=manifest_texts())
def test_any_manifest_text_is_a_manifest_or_one_line(text: bytes) -> None:
    def parse() -> None:
        try:
            parse_manifest(text, "manifest.json")
        except DatasetError as e:
            assert str(e).startswith("manifest.json: "), str(e)
            raise

    peak = allocated_by(parse, DatasetError)
    assert peak < 16 * len(text) + (256 << 10), f"parsed {len(text):,} bytes and allocated {peak:,}"
