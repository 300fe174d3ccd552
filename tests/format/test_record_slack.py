"""The bytes of a framed record outside its payload: dmlc writes zeros as padding and nothing after the record,
so a check of them and of the record's crc32 covers every byte of a shard whose records tile it (the node cache)."""

from __future__ import annotations

import pytest

from imgpipe.format.recordio import MAGIC_BYTES, frame_parts, parse_record, slack_problem


@pytest.mark.parametrize(
    "record",
    [b"", b"abcd", b"abcde", b"abcdefg", b"abcd" + MAGIC_BYTES + b"xyz", MAGIC_BYTES * 3 + b"q"],
    ids=["empty", "aligned", "padded 3", "padded 1", "split at a magic word", "three magic words"],
)
def test_the_slack_of_a_framed_record_is_checked(record: bytes) -> None:
    framed = b"".join(frame_parts(record))
    assert bytes(parse_record(framed, 0, len(framed), "x")[0]) == record
    assert slack_problem(framed) is None
    assert slack_problem(framed + b"\0") == "1 bytes after the record"
    assert slack_problem(framed[:-1]) == "not one whole record"
    pad = (-len(record)) & 3
    if pad:
        wrong = bytearray(framed)
        wrong[-1] = 0x5A
        assert bytes(parse_record(bytes(wrong), 0, len(wrong), "x")[0]) == record  # the record reads the same: only the slack differs
        assert slack_problem(bytes(wrong)) == f"the padding after byte {len(framed) - pad} of the record is not zero"
