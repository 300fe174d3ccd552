"""zlib's work in a pack (inflating gzip streams and deflated zip members): with ISA-L when
python-isal is installed (the ``fast`` extra), else with zlib.

The bytes are the same either way, and so are the checks (gzip's crc32 and length at the end of each
member, a deflate stream that stops early); only the speed and the wording of a corrupt stream's error
differ. A ``.tar.gz`` is inflated twice per pack (listed, then read): inflating is most of what packing
from Hugging Face's tarballs costs beyond the extracted tree (docs/benchmarks.md).
"""

from __future__ import annotations

import zlib
from typing import IO, Any

try:
    from isal import igzip as _gzip
    from isal import isal_zlib as _zlib

    BACKEND = "isal"
except ImportError:
    import gzip as _gzip  # type: ignore[no-redef]

    _zlib = zlib  # type: ignore[no-redef]
    BACKEND = "zlib"

ERRORS: tuple[type[BaseException], ...] = tuple({zlib.error, _zlib.error})  # what a corrupt stream raises


def open_gzip(fileobj: IO[bytes]) -> IO[bytes]:
    """A gzip reader over ``fileobj`` (``gzip.GzipFile``'s behaviour: members concatenated, zero padding allowed)."""
    return _gzip.GzipFile(fileobj=fileobj, mode="rb")  # type: ignore[return-value]


def raw_inflater() -> Any:
    """A decompressor of one raw deflate stream (a zip member): ``decompress(data, max_length)``, ``eof``."""
    return _zlib.decompressobj(-zlib.MAX_WBITS)
