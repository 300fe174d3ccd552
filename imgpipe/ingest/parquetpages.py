"""Where each image of a Parquet row group lies, read from the pages of its ``image.bytes`` column chunk.

pyarrow reads a binary column by building an Arrow array: it decompresses each page, then copies
every value into the array's buffer (growing it as it goes), and the dictionary's values once more.
For 110 KB JPEGs that costs about 60 us per image, and listing a file needs only the sizes. Here each
page is decompressed once (``pyarrow.Codec``) and walked: the page header (Thrift's compact
protocol), the definition levels, then the values, PLAIN (a 4-byte length before each) or
dictionary indices. An image is a slice of its page's buffer, with no copy.

What this does not walk (repeated columns, other encodings, Hadoop's LZ4, a damaged page) raises
``Unsupported``: the caller lets pyarrow read that row group, and pyarrow's verdict stands.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = range(4)
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY = 0, 2, 3, 8
CODECS = {"UNCOMPRESSED": None, "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd", "LZ4_RAW": "lz4_raw"}
_LENGTH = struct.Struct("<I")


class Unsupported(Exception):
    """A column chunk or page this reader does not walk."""


@dataclass
class Images:
    """Image k of a row group is ``buffers[which[k]][starts[k]:ends[k]]``; ``which[k]`` is -1 where it is null."""

    buffers: list[Any]
    which: np.ndarray  # int32
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64

    @property
    def sizes(self) -> np.ndarray:
        return self.ends - self.starts

    def image(self, k: int) -> bytes:
        which = int(self.which[k])
        return b"" if which < 0 else bytes(memoryview(self.buffers[which])[int(self.starts[k]) : int(self.ends[k])])


class ChunkReader:
    """Reads the ``column`` (a dotted path, e.g. ``image.bytes``) of a Parquet file's row groups, file mapped in memory."""

    def __init__(self, path: Path, metadata: Any, column: str) -> None:
        schema = metadata.schema
        names = [schema.column(i).path for i in range(len(schema))]
        if column not in names:
            raise Unsupported(f"no column {column}")
        self.index = names.index(column)
        described = schema.column(self.index)
        if described.physical_type != "BYTE_ARRAY" or described.max_repetition_level != 0:
            raise Unsupported(f"{column} is not a plain byte-array column")
        self.max_def, self.metadata = described.max_definition_level, metadata
        with open(path, "rb") as f:
            self.file = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))

    def read(self, group: int) -> Images:
        """The images of row group ``group``; ``Unsupported`` when its chunk is not one this reader walks."""
        rows = self.metadata.row_group(group)
        chunk = rows.column(self.index)
        if chunk.num_values != rows.num_rows:
            raise Unsupported("as many values as rows")
        codec = _codec(chunk.compression)
        start = chunk.dictionary_page_offset if chunk.has_dictionary_page and chunk.dictionary_page_offset else chunk.data_page_offset
        end = start + chunk.total_compressed_size
        if start <= 0 or end > len(self.file):
            raise Unsupported("column chunk outside the file")
        try:
            return _walk(self.file[start:end], chunk.num_values, self.max_def, codec, chunk.total_uncompressed_size)
        except (IndexError, KeyError, TypeError, ValueError, struct.error, OSError) as e:  # a damaged page (ArrowInvalid is a ValueError)
            raise Unsupported(f"unreadable page ({e})") from None


def _codec(name: str) -> Any:
    if name not in CODECS:
        raise Unsupported(f"codec {name}")
    if CODECS[name] is None:
        return None
    import pyarrow as pa

    if not pa.Codec.is_available(CODECS[name]):
        raise Unsupported(f"codec {name} not built into pyarrow")
    return pa.Codec(CODECS[name])


def _walk(chunk: memoryview, count: int, max_def: int, codec: Any, limit: int) -> Images:
    """Every value of a column chunk: ``count`` values (nulls included) in its pages, none larger than ``limit`` once decompressed."""
    buffers: list[Any] = []
    which, starts, ends = [], [], []
    dictionary: tuple[int, np.ndarray, np.ndarray] | None = None
    at = seen = 0
    while seen < count:
        header, at = _struct(chunk, at)
        kind, size, packed = header[1], header[2], header[3]
        if not 0 <= size <= limit:  # a damaged header must not make us allocate more than the chunk holds
            raise ValueError(f"page of {size} bytes in a column chunk of {limit}")
        body = chunk[at : at + packed]
        at += packed
        if len(body) != packed:
            raise ValueError("page past the end of its column chunk")
        if kind == DICTIONARY_PAGE:
            page = header[7]
            if page.get(2, PLAIN) not in (PLAIN, PLAIN_DICTIONARY):
                raise Unsupported("dictionary encoding")
            data = _decompress(codec, body, size)
            buffers.append(data)
            dictionary = (len(buffers) - 1, *_plain(data, 0, page[1]))
            continue
        if kind == DATA_PAGE:  # levels and values compressed together; levels prefixed by their length
            page = header[5]
            values, encoding = page[1], page[2]
            data = _decompress(codec, body, size)
            levels, offset = None, 0
            if max_def:
                if page.get(3) != RLE:
                    raise Unsupported("definition levels not RLE")
                offset = 4 + _LENGTH.unpack_from(data, 0)[0]
                levels = _hybrid(data[4:offset], max_def.bit_length(), values)
        elif kind == DATA_PAGE_V2:  # levels first and never compressed, then the values
            page = header[8]
            values, encoding, level_bytes, repeat_bytes = page[1], page[4], page[5], page[6]
            levels = _hybrid(body[repeat_bytes : repeat_bytes + level_bytes], max_def.bit_length(), values) if max_def else None
            rest = body[repeat_bytes + level_bytes :]
            data = _decompress(codec, rest, size - repeat_bytes - level_bytes) if page.get(7, True) else rest
            offset = 0
        else:
            continue  # an index page
        present = np.ones(values, bool) if levels is None else levels == max_def
        filled = int(present.sum())
        if encoding == PLAIN:
            buffers.append(data)
            page_starts, page_ends = _plain(data, offset, filled)
            source = len(buffers) - 1
        elif encoding in (PLAIN_DICTIONARY, RLE_DICTIONARY) and dictionary is not None:
            indices = _hybrid(data[offset + 1 :], data[offset], filled) if filled else np.zeros(0, np.int64)
            source, entries_start, entries_end = dictionary
            if len(indices) and int(indices.max()) >= len(entries_start):
                raise ValueError("dictionary index out of range")
            page_starts, page_ends = entries_start[indices], entries_end[indices]
        else:
            raise Unsupported(f"value encoding {encoding}")
        row_which = np.full(values, -1, np.int32)
        row_which[present] = source
        row_starts, row_ends = np.zeros(values, np.int64), np.zeros(values, np.int64)
        row_starts[present], row_ends[present] = page_starts, page_ends
        which.append(row_which)
        starts.append(row_starts)
        ends.append(row_ends)
        seen += values
    if seen != count:
        raise ValueError(f"{seen} values in the pages, {count} in the metadata")
    join = lambda parts, dtype: np.concatenate(parts) if parts else np.zeros(0, dtype)  # noqa: E731
    return Images(buffers, join(which, np.int32), join(starts, np.int64), join(ends, np.int64))


def _decompress(codec: Any, body: memoryview, size: int) -> memoryview:
    """The page's bytes, as unsigned bytes (a pyarrow buffer exports signed ones)."""
    if codec is None:
        return body
    return memoryview(codec.decompress(body, decompressed_size=size)).cast("B")


def _plain(data: memoryview, at: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Where ``count`` PLAIN byte arrays from ``at`` lie (each is a 4-byte length, then its bytes)."""
    starts, ends = np.empty(count, np.int64), np.empty(count, np.int64)
    unpack, end = _LENGTH.unpack_from, len(data)
    for k in range(count):
        length = unpack(data, at)[0]
        starts[k] = at = at + 4
        ends[k] = at = at + length
    if at > end:
        raise ValueError("a value runs past its page")
    return starts, ends


def _hybrid(data: memoryview, width: int, count: int) -> np.ndarray:
    """``count`` values of Parquet's RLE / bit-packed hybrid encoding, ``width`` bits each."""
    runs, got, at = [], 0, 0
    while got < count:
        header, at = _varint(data, at)
        if header & 1:  # bit-packed: groups of 8 values
            number = (header >> 1) * 8
            if number == 0:
                raise ValueError("empty bit-packed run")
            nbytes = (header >> 1) * width
            packed = np.frombuffer(data, np.uint8, min(nbytes, len(data) - at), at)
            if len(packed) * 8 < min(number, count - got) * width:  # writers may cut the last run after its last value
                raise ValueError("bit-packed run past the end")
            bits = np.unpackbits(np.pad(packed, (0, nbytes - len(packed))), bitorder="little").reshape(number, width)
            runs.append(bits.astype(np.int64) @ (1 << np.arange(width, dtype=np.int64)))
            at += nbytes
        else:
            number, nbytes = header >> 1, (width + 7) // 8
            if at + nbytes > len(data) or number == 0:
                raise ValueError("RLE run past the end")
            runs.append(np.full(number, int.from_bytes(data[at : at + nbytes], "little"), np.int64))
            at += nbytes
        got += number
    return np.concatenate(runs)[:count]


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _struct(data: memoryview, at: int) -> tuple[dict[int, Any], int]:
    """A Thrift compact-protocol struct from ``at``: field id -> value (nested structs as dicts)."""
    fields: dict[int, Any] = {}
    field = 0
    while True:
        byte = data[at]
        at += 1
        if byte == 0:
            return fields, at
        kind, delta = byte & 0x0F, byte >> 4
        if delta:
            field += delta
        else:
            raw, at = _varint(data, at)
            field = (raw >> 1) ^ -(raw & 1)
        fields[field], at = _value(data, at, kind)


def _value(data: memoryview, at: int, kind: int) -> tuple[Any, int]:
    if kind in (1, 2):  # a struct field's booleans live in the type nibble
        return kind == 1, at
    if kind == 3:
        return data[at], at + 1
    if kind in (4, 5, 6):
        raw, at = _varint(data, at)
        return (raw >> 1) ^ -(raw & 1), at
    if kind == 7:
        return data[at : at + 8], at + 8
    if kind == 8:
        length, at = _varint(data, at)
        return data[at : at + length], at + length
    if kind in (9, 10):
        head = data[at]
        at += 1
        size, element = head >> 4, head & 0x0F
        if size == 15:
            size, at = _varint(data, at)
        items = []
        for _ in range(size):
            if element in (1, 2):  # a list's booleans are one byte each
                items.append(data[at] == 1)
                at += 1
            else:
                item, at = _value(data, at, element)
                items.append(item)
        return items, at
    if kind == 11:
        size, at = _varint(data, at)
        if size == 0:
            return {}, at
        types = data[at]
        at += 1
        for _ in range(size):
            _, at = _value(data, at, types >> 4)
            _, at = _value(data, at, types & 0x0F)
        return {}, at
    if kind == 12:
        return _struct(data, at)
    raise ValueError(f"Thrift type {kind}")
