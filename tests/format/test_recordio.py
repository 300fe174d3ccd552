"""RecordIO framing, IRHeader and .idx parsing, checked against dmlc-core's rules (no mxnet needed)."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from _recordio_helpers import frame, read_indexed

from imgpipe.errors import RecordIOError
from imgpipe.format import recordio
from imgpipe.format.recordio import MAGIC, MAGIC_BYTES, IRHeader

M = MAGIC_BYTES


def dmlc_write_record(buf: bytes) -> bytes:
    """dmlc-core RecordIOWriter::WriteRecord transcribed line by line (src/recordio.cc)."""
    length = len(buf)
    lower_align = (length >> 2) << 2
    upper_align = ((length + 3) >> 2) << 2
    out = bytearray()
    dptr = 0
    for i in range(0, lower_align, 4):
        if buf[i : i + 4] == M:
            out += struct.pack("<II", MAGIC, ((1 if dptr == 0 else 2) << 29) | (i - dptr))
            out += buf[dptr:i]
            dptr = i + 4
    out += struct.pack("<II", MAGIC, ((3 if dptr != 0 else 0) << 29) | (length - dptr))
    out += buf[dptr:]
    out += b"\0" * (upper_align - length)
    return bytes(out)


def frames_of(framed: bytes) -> list[tuple[int, bytes]]:
    """(cflag, body) of every frame in a framed record, read with plain struct calls."""
    out, pos = [], 0
    while pos < len(framed):
        magic, lrec = struct.unpack_from("<II", framed, pos)
        assert magic == MAGIC
        length = lrec & ((1 << 29) - 1)
        out.append((lrec >> 29, framed[pos + 8 : pos + 8 + length]))
        pos += 8 + length + (-length & 3)
    return out


# ----------------------------------------------------------------------------- framing


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 7, 8])
def test_frame_of_small_payload_is_magic_length_payload_and_zero_pad(size: int) -> None:
    payload = bytes(range(1, size + 1))
    framed = frame(payload)
    pad = -size & 3
    assert framed == struct.pack("<II", MAGIC, size) + payload + b"\0" * pad
    assert len(framed) % 4 == 0
    assert recordio.parse_record(framed, 0, len(framed), "mem") == (payload, len(framed))


def test_frame_of_1mb_payload_round_trips() -> None:
    payload = np.random.default_rng(0).integers(0, 256, (1 << 20) + 3, dtype=np.uint8).tobytes()
    framed = frame(payload)
    assert framed == dmlc_write_record(payload)
    assert recordio.parse_record(framed, 0, len(framed), "mem") == (payload, len(framed))


CASES = {
    "magic only": (M, [(1, b""), (3, b"")]),
    "magic at start": (M + b"tail", [(1, b""), (3, b"tail")]),
    "magic at aligned middle": (b"abcd" + M + b"xy", [(1, b"abcd"), (3, b"xy")]),
    "magic at aligned end": (b"abcd" + M, [(1, b"abcd"), (3, b"")]),
    "three in a row": (M * 3 + b"z", [(1, b""), (2, b""), (2, b""), (3, b"z")]),
    "two apart": (b"ab12" + M + b"cd34" + M + b"e", [(1, b"ab12"), (2, b"cd34"), (3, b"e")]),
    "unaligned at 1": (b"a" + M + b"bcd", [(0, b"a" + M + b"bcd")]),
    "unaligned at 2": (b"ab" + M, [(0, b"ab" + M)]),
    "unaligned at 3 then aligned": (b"abc" + M + b"d" + M, [(1, b"abc" + M + b"d"), (3, b"")]),
    "unaligned at 3 and 9": (b"abc" + M + b"de" + M, [(0, b"abc" + M + b"de" + M)]),
    "unaligned hit before aligned hit": (b"x" + M + b"yyy" + M, [(1, b"x" + M + b"yyy"), (3, b"")]),
    "magic cut by the end": (b"abcd" + M[:3], [(0, b"abcd" + M[:3])]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_magic_in_payload_is_split_as_dmlc_does(name: str) -> None:
    payload, expected = CASES[name]
    framed = frame(payload)
    assert framed == dmlc_write_record(payload)
    assert frames_of(framed) == expected
    record, end = recordio.parse_record(framed, 0, len(framed), "mem")
    assert record == payload and end == len(framed)


def test_split_frames_keep_4_byte_alignment_and_only_the_last_is_padded() -> None:
    payload = b"abcdefgh" + M + b"123"
    framed = frame(payload)
    assert framed == (struct.pack("<II", MAGIC, (1 << 29) | 8) + b"abcdefgh" + struct.pack("<II", MAGIC, (3 << 29) | 3) + b"123\0")


# ----------------------------------------------------------------------------- IRHeader


def test_header_single_label_bytes_and_round_trip() -> None:
    record = recordio.pack_header(IRHeader(7, 3.0, 12, 34), b"JPEG")
    assert record == struct.pack("<IfQQ", 0, 3.0, 12, 34) + b"JPEG"  # flag forced to 0, as mxnet.recordio.pack
    header, payload = recordio.unpack_header(record)
    assert header == IRHeader(0, 3.0, 12, 34) and payload == b"JPEG"


def test_header_multi_label_bytes_and_round_trip() -> None:
    labels = [1.5, -2.0, 3.25]
    record = recordio.pack_header(IRHeader(0, labels, 2**64 - 1, 5), b"img")
    assert record[:24] == struct.pack("<IfQQ", 3, 0.0, 2**64 - 1, 5)
    assert record[24:36] == np.array(labels, "<f4").tobytes()
    header, payload = recordio.unpack_header(record)
    assert header.flag == 3 and header.label.dtype == np.float32 and header.label.tolist() == labels
    assert (header.id, header.id2, payload) == (2**64 - 1, 5, b"img")


def test_header_numpy_scalar_is_a_single_label_and_0d_array_a_label_list() -> None:
    assert recordio.pack_header(IRHeader(0, np.float32(2), 1, 0), b"")[:4] == struct.pack("<I", 0)
    assert recordio.pack_header(IRHeader(0, np.array(2.0), 1, 0), b"")[:4] == struct.pack("<I", 1)


def test_unpack_header_of_short_record_names_file_and_offset() -> None:
    with pytest.raises(RecordIOError, match=r"^shard\.rec: offset 96: record of 10 bytes"):
        recordio.unpack_header(b"x" * 10, "shard.rec", 96)


def test_unpack_header_refuses_label_count_beyond_the_record() -> None:
    record = struct.pack("<IfQQ", 2**32 - 1, 0.0, 0, 0) + b"abcd"
    with pytest.raises(RecordIOError, match=r"^s\.rec: offset 8: IRHeader label count 4294967295"):
        recordio.unpack_header(record, "s.rec", 8)


# ----------------------------------------------------------------------------- writer + readers


def write_shard(tmp_path, payloads: list[bytes], keys: list[int] | None = None):
    rec, idx = tmp_path / "s.rec", tmp_path / "s.idx"
    keys = keys if keys is not None else [3 * i for i in range(len(payloads))]
    offsets = []
    with recordio.IndexedRecordWriter(rec, idx) as writer:
        for key, (i, payload) in zip(keys, enumerate(payloads)):
            offsets.append(writer.write(key, recordio.pack_header(IRHeader(0, float(i), key, 0), payload)))
        writer.flush_to_disk()
        assert writer.position == rec.stat().st_size
    assert len(idx.read_text().splitlines()) == len(payloads)
    return rec, idx, keys, offsets


PAYLOADS = [b"", b"a", b"ab", b"abc", M, b"x" + M, M * 2 + b"yz", b"q" * 1000, bytes(range(256)) * 5]


def test_writer_index_and_readers_round_trip(tmp_path) -> None:
    rec, idx, keys, offsets = write_shard(tmp_path, PAYLOADS)
    assert idx.read_text() == "".join(f"{k}\t{o}\n" for k, o in zip(keys, offsets))
    got_keys, got_offsets = recordio.read_index(idx)
    assert got_keys.dtype == got_offsets.dtype == np.int64
    assert got_keys.tolist() == keys and got_offsets.tolist() == offsets
    read = list(read_indexed(rec, idx))
    assert [k for k, _, _ in read] == keys
    assert [p for _, _, p in read] == PAYLOADS
    assert [h.label for _, h, _ in read] == [float(i) for i in range(len(PAYLOADS))]
    assert [h.id for _, h, _ in read] == keys
    frames = list(recordio.iter_frames(rec))
    assert [o for o, _ in frames] == offsets
    assert [recordio.unpack_header(r)[1] for _, r in frames] == PAYLOADS


def test_read_record_at_and_parse_record_with_base_give_file_offsets(tmp_path) -> None:
    rec, _, _, offsets = write_shard(tmp_path, PAYLOADS)
    data = rec.read_bytes()
    size = len(data)
    with open(rec, "rb") as f:
        for k, off in enumerate(offsets):
            record, end = recordio.read_record_at(f, off, size, rec)
            assert recordio.unpack_header(record)[1] == PAYLOADS[k]
            assert end == (offsets[k + 1] if k + 1 < len(offsets) else size)
    base = offsets[4]
    window = data[base:]
    record, end = recordio.parse_record(window, 0, len(window), rec, base=base)
    assert recordio.unpack_header(record)[1] == M and end == offsets[5]
    with pytest.raises(RecordIOError) as err:
        recordio.parse_record(window, 2, len(window), rec, base=base)
    assert err.value.offset == base + 2


def test_empty_rec_and_idx_are_an_empty_shard(tmp_path) -> None:
    rec, idx, _, _ = write_shard(tmp_path, [])
    assert rec.stat().st_size == 0 and idx.read_bytes() == b""
    assert list(recordio.iter_frames(rec)) == [] and list(read_indexed(rec, idx)) == []


# ----------------------------------------------------------------------------- malformed .rec


def framed_file(tmp_path, data: bytes):
    path = tmp_path / "bad.rec"
    path.write_bytes(data)
    return path


def lrec(cflag: int, length: int) -> bytes:
    return struct.pack("<II", MAGIC, (cflag << 29) | length)


MALFORMED = {
    "truncated header": (frame(b"abcd") + lrec(0, 4)[:5], 12, r"truncated: 5 bytes left where a record header"),
    "truncated body": (frame(b"abcd") + lrec(0, 8) + b"1234", 12, r"length 8 runs past the end \(4 bytes left\)"),
    "missing padding": (lrec(0, 5) + b"12345", 0, r"length 5 runs past the end"),
    "bad magic": (frame(b"abcd") + b"\xde\xad\xbe\xef" + b"\0" * 4, 12, r"bad magic 0xefbeadde"),
    "huge length": (lrec(0, (1 << 29) - 1) + b"\0" * 64, 0, r"length 536870911 runs past the end"),
    "last without first": (lrec(3, 0), 0, r"continue flag 3 out of sequence"),
    "middle without first": (lrec(2, 4) + b"abcd", 0, r"continue flag 2 out of sequence"),
    "first then whole": (lrec(1, 0) + lrec(0, 0), 8, r"continue flag 0 out of sequence"),
    "first then first": (lrec(1, 0) + lrec(1, 0), 8, r"continue flag 1 out of sequence"),
    "cflag above 3": (lrec(5, 0), 0, r"continue flag 5 out of sequence"),
    "first then end of file": (lrec(1, 4) + b"abcd", 12, r"truncated: 0 bytes left where a continuation frame was expected"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_rec_names_file_and_offset(tmp_path, name: str) -> None:
    data, offset, problem = MALFORMED[name]
    path = framed_file(tmp_path, data)
    with pytest.raises(RecordIOError, match=rf"^{re.escape(str(path))}: offset {offset}: {problem}") as err:
        list(recordio.iter_frames(path))
    assert err.value.path == str(path) and err.value.offset == offset
    with pytest.raises(RecordIOError, match=rf"^mem: offset {offset}: {problem}"):
        pos = 0
        while pos < len(data):
            _, pos = recordio.parse_record(data, pos, len(data), "mem")


def test_parse_record_refuses_a_range_outside_the_buffer() -> None:
    with pytest.raises(ValueError):
        recordio.parse_record(b"\0" * 8, 0, 16, "mem")


def test_index_offset_past_end_of_rec_names_the_index(tmp_path) -> None:
    rec, idx, _, _ = write_shard(tmp_path, [b"a", b"b"])
    idx.write_text(idx.read_text() + "9\t4096\n")
    with pytest.raises(
        RecordIOError, match=rf"^{re.escape(str(idx))}: offset 4096: index offset 4096 is past the end of {re.escape(str(rec))}"
    ):
        list(read_indexed(rec, idx))


def test_index_offset_inside_a_record_is_bad_magic(tmp_path) -> None:
    rec, idx, _, offsets = write_shard(tmp_path, [b"abcdefgh", b"b"])
    idx.write_text(f"0\t{offsets[0] + 4}\n")
    with pytest.raises(RecordIOError, match=rf"^{re.escape(str(rec))}: offset 4: bad magic"):
        list(read_indexed(rec, idx))


# ----------------------------------------------------------------------------- .idx text


def parse_idx(tmp_path, text: bytes):
    path = tmp_path / "t.idx"
    path.write_bytes(text)
    keys, offsets = recordio.read_index(path)
    return keys.tolist(), offsets.tolist()


@pytest.mark.parametrize(
    "text",
    [
        b"0\t0\n5\t40\n9\t1234567890123\n",
        b"0\t0\r\n5\t40\r\n9\t1234567890123\r\n",
        b"0 0\n\n5  40\n   \n9\t1234567890123",
        b"0\t0\n5\t40\n9\t1234567890123\n\n",
        b"0\t0\n5\t40\n0000000000000000000000000009\t00000000000000000000001234567890123\n",
        b"+0\t0\n5\t+40\n9\t1234567890123\n",  # as MXNet's int() reads them
    ],
)
def test_index_text_variants_parse_the_same(tmp_path, text: bytes) -> None:
    assert parse_idx(tmp_path, text) == ([0, 5, 9], [0, 40, 1234567890123])


def test_index_keeps_negative_keys_and_int64_extremes(tmp_path) -> None:
    big = 2**63 - 1
    assert parse_idx(tmp_path, f"-3\t0\n{-(2**63)}\t{big}\n{big}\t7\n".encode()) == ([-3, -(2**63), big], [0, big, 7])


def test_empty_index(tmp_path) -> None:
    assert parse_idx(tmp_path, b"") == ([], [])
    assert parse_idx(tmp_path, b"\n\n") == ([], [])


BAD_LINE = r"line 3 is not 'key<TAB>offset' \(64-bit integers, the offset >= 0\): "


@pytest.mark.parametrize(
    "bad_line, shown",
    [
        (b"7\t8\t9", r"'7\\t8\\t9'"),
        (b"7", r"'7'"),
        (b"7\tx12", r"'7\\tx12'"),
        (b"7\t1.5", r"'7\\t1.5'"),
        (b"7\t1e3", r"'7\\t1e3'"),
        (b"7\t-", r"'7\\t-'"),
        (b"--7\t8", r"'--7\\t8'"),
        (b"7\t-8", r"'7\\t-8'"),
        (b"7\t9223372036854775808", r"'7\\t9223372036854775808'"),
        (b"99999999999999999999\t8", r"'99999999999999999999\\t8'"),
        (b"-9223372036854775809\t8", r"'-9223372036854775809\\t8'"),
        (b"00000000000000000000000000007\t00000000000000000000000000000000008\t9", r"'0+7\\t0+'\.\.\."),
    ],
)
def test_bad_index_line_names_file_line_and_offset(tmp_path, bad_line: bytes, shown: str) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(b"0\t0\n1\t16\n" + bad_line + b"\n2\t32\n")
    with pytest.raises(RecordIOError, match=rf"^{re.escape(str(path))}: offset 9: {BAD_LINE}{shown}$") as err:
        recordio.read_index(path)
    assert err.value.offset == 9


def test_large_canonical_index_parses_exactly(tmp_path) -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(-(2**40), 2**62, 50_000)
    offsets = np.cumsum(rng.integers(0, 2**20, 50_000))
    path = tmp_path / "big.idx"
    path.write_text("".join(recordio.format_index_line(k, o) for k, o in zip(keys.tolist(), offsets.tolist())))
    got_keys, got_offsets = recordio.read_index(path)
    assert np.array_equal(got_keys, keys) and np.array_equal(got_offsets, offsets)
    assert got_keys.flags.c_contiguous and got_offsets.flags.c_contiguous


def test_a_bad_line_deep_in_an_index_is_named_by_its_number_and_offset(tmp_path) -> None:
    text = b"".join(recordio.format_index_line(k * 7 - 50, k * 1000).encode() for k in range(3000))
    assert parse_idx(tmp_path, text + b"5\t5") == ([k * 7 - 50 for k in range(3000)] + [5], [k * 1000 for k in range(3000)] + [5])
    path = tmp_path / "bad.idx"
    path.write_bytes(text + b"1\t2\t3\n" + text)
    with pytest.raises(RecordIOError, match=rf"^{re.escape(str(path))}: offset {len(text)}: line 3001 is not"):
        recordio.read_index(path)


def test_index_with_a_huge_line_is_refused_by_line(tmp_path) -> None:
    path = tmp_path / "huge.idx"
    path.write_bytes(b"0\t0\n" + b"1" * 3_000_000 + b"\t0\n")
    with pytest.raises(RecordIOError, match=r"offset 4: line 2 is not 'key<TAB>offset' .*: '1{40}'\.\.\.$"):
        recordio.read_index(path)
    path.write_bytes(b"0\t0\n" + b"1" * 3_000_000 + b"\n")
    with pytest.raises(RecordIOError, match=r"offset 4: line 2 is not 'key<TAB>offset' .*: '1{40}'\.\.\.$"):
        recordio.read_index(path)
