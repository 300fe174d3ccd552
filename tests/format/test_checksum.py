"""The records' crc32 is zlib's CRC-32 whichever library computes it (the sidecars stay readable by any reader)."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from imgpipe._sys import checksum


@given(st.binary(max_size=70_000), st.integers(0, 64))
def test_crc32_is_zlibs_over_bytes_and_views(data: bytes, cut: int) -> None:
    assert checksum.crc32(data) == zlib.crc32(data)
    view = memoryview(data)[cut:]
    assert checksum.crc32(view) == zlib.crc32(view)


def test_crc32_is_isals_where_python_isal_is_installed() -> None:
    try:
        from isal import isal_zlib
    except ImportError:
        assert checksum.crc32 is zlib.crc32
    else:
        assert checksum.crc32 is isal_zlib.crc32
