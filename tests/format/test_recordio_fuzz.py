"""Property tests: a mutated .rec/.idx either reads or raises RecordIOError naming file and offset,
never another exception, never a hang, and never allocates beyond the size of the files."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from _bounded import allocated_by
from _recordio_helpers import frame, read_indexed
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from imgpipe.errors import RecordIOError
from imgpipe.format import recordio
from imgpipe.format.recordio import MAGIC, MAGIC_BYTES, IRHeader

SLACK = 64 * 1024  # Python object overheads, exception objects, tracemalloc's own records
# no explain phase: its line tracer allocates inside the measured read when a stored failure is replayed
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


def valid_shard() -> tuple[bytes, bytes, list[int]]:
    """A small shard holding the awkward cases: empty, tiny, magic-split and multi-label records."""
    payloads = [b"", b"a", b"abc", MAGIC_BYTES, b"ab" + MAGIC_BYTES * 2, b"x" * 300, MAGIC_BYTES + b"jpeg" * 20]
    with tempfile.TemporaryDirectory() as tmp:
        rec, idx = Path(tmp) / "s.rec", Path(tmp) / "s.idx"
        offsets = []
        with recordio.IndexedRecordWriter(rec, idx) as writer:
            for i, payload in enumerate(payloads):
                label: float | list[float] = float(i) if i % 3 else [float(i), 0.5, -1.0]
                offsets.append(writer.write(10 * i, recordio.pack_header(IRHeader(0, label, 10 * i, 0), payload)))
        return rec.read_bytes(), idx.read_bytes(), offsets


REC, IDX, OFFSETS = valid_shard()
WORD_VALUES = st.sampled_from(
    [MAGIC, 0, 0xFFFFFFFF, (1 << 29) - 1, (3 << 29) | 4, (1 << 29) | 8, (2 << 29), (7 << 29) | 100, 2**31 - 1, 1 << 28]
)


@st.composite
def rec_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    kind = draw(st.sampled_from(["truncate", "flip", "word", "label_count", "append", "insert"]))
    if len(buf) < 4:  # truncated to almost nothing: only growing it still makes sense
        kind = "append"
    if kind == "truncate":
        del buf[draw(st.integers(0, len(buf))) :]
    elif kind == "flip":
        at = draw(st.integers(0, len(buf) - 1))
        buf[at] ^= draw(st.integers(1, 255))
    elif kind == "word":  # a magic or length word, or any aligned word, set to a nasty value
        at = 4 * draw(st.integers(0, len(buf) // 4 - 1))
        struct.pack_into("<I", buf, at, draw(WORD_VALUES))
    elif kind == "label_count":  # IRHeader flag of one record: a huge or slightly-too-big label count
        at = draw(st.sampled_from(OFFSETS)) + 8
        if at + 4 <= len(buf):
            struct.pack_into("<I", buf, at, draw(st.sampled_from([2**32 - 1, 2**31, 1 << 20, 7, 80])))
    elif kind == "append":
        buf += draw(st.binary(max_size=64)) + draw(st.sampled_from([b"", MAGIC_BYTES, struct.pack("<II", MAGIC, 1 << 29)]))
    else:
        at = draw(st.integers(0, len(buf)))
        buf[at:at] = draw(st.binary(min_size=1, max_size=12))
    return bytes(buf)


@st.composite
def idx_mutation(draw: st.DrawFn, text: bytes) -> bytes:
    lines = text.splitlines(keepends=True)
    kind = draw(st.sampled_from(["keep", "offset", "garbage", "drop", "duplicate", "truncate"]))
    at = draw(st.integers(0, len(lines) - 1))
    if kind == "offset":
        key = lines[at].split(b"\t")[0]
        value = draw(st.one_of(st.integers(-(2**70), 2**70), st.integers(0, len(REC) + 16)))
        lines[at] = key + b"\t" + str(value).encode() + b"\n"
    elif kind == "garbage":
        lines[at] = draw(st.binary(max_size=24).filter(lambda b: b"\n" not in b)) + b"\n"
    elif kind == "drop":
        del lines[at]
    elif kind == "duplicate":
        lines.insert(at, lines[at])
    elif kind == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    return b"".join(lines)


def mutated_files() -> st.SearchStrategy[tuple[bytes, bytes]]:
    rec = st.recursive(st.just(REC), lambda inner: inner.flatmap(rec_mutation), max_leaves=3)
    return st.tuples(rec.filter(lambda r: r != REC), idx_mutation(IDX)) | st.tuples(st.just(REC), idx_mutation(IDX))


def read_everything(rec: Path, idx: Path) -> None:
    for _ in recordio.iter_frames(rec):
        pass
    for _ in read_indexed(rec, idx):
        pass
    data = rec.read_bytes()
    for offset in OFFSETS:
        if offset < len(data):
            record, _ = recordio.parse_record(data, offset, len(data), rec)
            recordio.unpack_header(record, rec, offset)


def check_fails_cleanly(action, names: list[object], size: int) -> None:
    """Run ``action``: success, or a one-line RecordIOError naming one of ``names`` and its offset;
    either way its peak allocation stays below ``size`` (the bytes on disk) plus a small constant."""

    def named() -> None:
        try:
            action()
        except RecordIOError as e:
            assert any(str(e).startswith(f"{name}: offset {e.offset}: ") for name in names), str(e)
            raise

    peak = allocated_by(named, RecordIOError)
    assert peak < size + SLACK, f"read allocated {peak} bytes for {size} bytes of input"


@pytest.mark.timeout(120)
@FUZZ
@given(files=mutated_files())
def test_mutated_shard_reads_or_raises_recordio_error(files: tuple[bytes, bytes]) -> None:
    rec_bytes, idx_bytes = files
    with tempfile.TemporaryDirectory() as tmp:
        rec, idx = Path(tmp) / "m.rec", Path(tmp) / "m.idx"
        rec.write_bytes(rec_bytes)
        idx.write_bytes(idx_bytes)
        check_fails_cleanly(lambda: read_everything(rec, idx), [rec, idx], len(rec_bytes) + len(idx_bytes))


@pytest.mark.timeout(60)
@FUZZ
@given(record=st.binary(max_size=64), claim=st.integers(0, 2**32 - 1))
def test_any_record_with_any_label_count_unpacks_or_raises(record: bytes, claim: int) -> None:
    record = struct.pack("<IfQQ", claim, 0.0, 1, 2) + record if claim % 2 else record
    check_fails_cleanly(lambda: recordio.unpack_header(record, "r.rec", 4), ["r.rec"], len(record))


@pytest.mark.timeout(60)
@settings(max_examples=200, deadline=None)
@given(payload=st.lists(st.sampled_from([b"a", b"bc", b"\x00", MAGIC_BYTES, MAGIC_BYTES[:2], b"\xce"]), max_size=24).map(b"".join))
def test_frame_then_parse_is_identity_for_payloads_full_of_magic(payload: bytes) -> None:
    framed = frame(payload)
    assert len(framed) % 4 == 0
    assert recordio.parse_record(framed, 0, len(framed), "mem") == (payload, len(framed))


INDEX_TEXT = st.lists(st.sampled_from(list(b"0123456789-\t\n \r") + [ord("9")] * 4), max_size=80).map(bytes)


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None)
@given(
    text=INDEX_TEXT
    | st.lists(st.tuples(st.integers(-(2**64), 2**64), st.integers(-5, 2**64)), max_size=6).map(
        lambda pairs: "".join(f"{k}\t{o}\n" for k, o in pairs).encode()
    )
)
def test_the_index_parser_reads_what_a_line_by_line_reading_reads(text: bytes) -> None:
    """parse_index gives the values of every ``key offset`` line (int64s, offset >= 0, blank lines skipped), or refuses the text."""
    expected = []
    for line in text.splitlines():
        fields = line.split()
        if fields:
            values = [int(f) if f.lstrip(b"+-").isdigit() and f.count(b"-") + f.count(b"+") <= 1 else None for f in fields]
            in_range = None not in values and all(-(2**63) <= v < 2**63 for v in values)  # type: ignore[operator]
            expected.append(values if len(values) == 2 and in_range and values[1] >= 0 else None)  # type: ignore[operator]
    try:
        keys, offsets = recordio.parse_index(text, "x.idx")
    except RecordIOError as e:
        assert None in expected, f"refused {text!r}, which reads line by line as {expected}: {e}"
        return
    assert keys.dtype == offsets.dtype == np.int64
    assert [list(pair) for pair in zip(keys.tolist(), offsets.tolist())] == expected


@pytest.mark.timeout(60)
@FUZZ
@given(text=INDEX_TEXT | st.binary(max_size=200) | idx_mutation(IDX) | st.just(b"1\t" + b"9" * 5000 + b"\n"))
def test_any_index_file_is_read_or_a_recordio_error_within_bounds(text: bytes) -> None:
    """An .idx of any bytes, on its own: its line count, keys and offsets are bounded by the bytes that hold them."""
    with tempfile.TemporaryDirectory() as tmp:
        idx = Path(tmp) / "m.idx"
        idx.write_bytes(text)
        check_fails_cleanly(lambda: recordio.read_index(idx), [idx], 4 * len(text))
