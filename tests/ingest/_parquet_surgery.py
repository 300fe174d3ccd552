"""Damage a Parquet file that pyarrow wrote, for the hostile-input tests: Thrift's compact protocol
read and written back (fields kept with their types, so a header can be changed and re-encoded),
and a page header or page body replaced in place.

A page that changes length moves what follows it: the footer is read, its offsets and the sizes of
the column chunk and row group that hold the page are changed to match, and it is written back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)


@dataclass
class Struct:
    """A Thrift struct as read: its fields in order, each (id, type, value)."""

    fields: list[tuple[int, int, Any]] = field(default_factory=list)

    def get(self, fid: int) -> Any:
        return next((value for i, _, value in self.fields if i == fid), None)

    def set(self, fid: int, kind: int, value: Any) -> None:
        self.fields = [f for f in self.fields if f[0] != fid] + [(fid, kind, value)]
        self.fields.sort(key=lambda f: f[0])

    def drop(self, fid: int) -> None:
        self.fields = [f for f in self.fields if f[0] != fid]


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63) if value < 0 else value << 1


class Reader:
    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data, self.at = data, at

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def struct(self) -> Struct:
        out, fid = Struct(), 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            if byte == STOP:
                return out
            kind, delta = byte & 0x0F, byte >> 4
            if delta:
                fid += delta
            else:
                raw = self.varint()
                fid = (raw >> 1) ^ -(raw & 1)
            out.fields.append((fid, kind, self.value(kind)))

    def value(self, kind: int) -> Any:
        if kind in (TRUE, FALSE):
            return kind == TRUE
        if kind == BYTE:
            self.at += 1
            return self.data[self.at - 1]
        if kind in (I16, I32, I64):
            raw = self.varint()
            return (raw >> 1) ^ -(raw & 1)
        if kind == DOUBLE:
            self.at += 8
            return self.data[self.at - 8 : self.at]
        if kind == BINARY:
            n = self.varint()
            self.at += n
            return self.data[self.at - n : self.at]
        if kind in (LIST, SET):
            head = self.data[self.at]
            self.at += 1
            size, element = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            items = []
            for _ in range(size):
                if element in (TRUE, FALSE):  # a list's booleans are one byte each
                    items.append(self.data[self.at] == TRUE)
                    self.at += 1
                else:
                    items.append(self.value(element))
            return element, items
        if kind == STRUCT:
            return self.struct()
        raise ValueError(f"Thrift type {kind}")


def encode_struct(struct: Struct) -> bytes:
    out, last = bytearray(), 0
    for fid, kind, value in struct.fields:
        wire = (TRUE if value else FALSE) if kind in (TRUE, FALSE) else kind
        out += bytes([(fid - last) << 4 | wire]) if 0 < fid - last <= 15 else bytes([wire]) + varint(zigzag(fid))
        last = fid
        if kind not in (TRUE, FALSE):
            out += encode_value(kind, value)
    return bytes(out + b"\x00")


def encode_value(kind: int, value: Any) -> bytes:
    if kind == BYTE:
        return bytes([value])
    if kind in (I16, I32, I64):
        return varint(zigzag(value))
    if kind == DOUBLE:
        return bytes(value)
    if kind == BINARY:
        return varint(len(value)) + bytes(value)
    if kind in (LIST, SET):
        element, items = value
        head = bytes([len(items) << 4 | element]) if len(items) < 15 else bytes([0xF0 | element]) + varint(len(items))
        return head + b"".join(bytes([TRUE if x else FALSE]) if element in (TRUE, FALSE) else encode_value(element, x) for x in items)
    if kind == STRUCT:
        return encode_struct(value)
    raise ValueError(f"Thrift type {kind}")


@dataclass
class Page:
    """One page of a column chunk: where its header starts, the header, and where its body lies."""

    at: int
    header: Struct
    header_size: int
    body_at: int
    body_size: int


def pages(path: Path, column: str = "image.bytes", group: int = 0) -> list[Page]:
    """Every page of ``column``'s chunk in row group ``group``, in file order."""
    data = path.read_bytes()
    metadata = pq.ParquetFile(path).metadata
    names = [metadata.schema.column(i).path for i in range(len(metadata.schema))]
    chunk = metadata.row_group(group).column(names.index(column))
    at = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    end = at + chunk.total_compressed_size
    out = []
    while at < end:
        reader = Reader(data, at)
        header = reader.struct()
        out.append(Page(at, header, reader.at - at, reader.at, header.get(3)))
        at = reader.at + header.get(3)
    return out


def replace_header(path: Path, page: Page, header: Struct | bytes) -> None:
    """Write ``header`` (a struct, or raw bytes) in place of ``page``'s; the footer's offsets follow."""
    splice(path, page.at, page.header_size, header if isinstance(header, bytes) else encode_struct(header))


def replace_page(path: Path, page: Page, header: Struct, body: bytes) -> None:
    """``page`` becomes ``header`` and ``body`` (the header's page sizes set to the body's length)."""
    header.set(2, I32, len(body))
    header.set(3, I32, len(body))
    splice(path, page.at, page.header_size + page.body_size, encode_struct(header) + body)


def splice(path: Path, at: int, size: int, data: bytes) -> None:
    """Replace ``size`` bytes at ``at`` by ``data``: every footer offset past ``at`` moves, and the column chunk
    and row group that hold ``at`` grow or shrink, so a reader finds everything else where it was."""
    raw = path.read_bytes()
    footer_size = int.from_bytes(raw[-8:-4], "little")
    footer_at = len(raw) - 8 - footer_size
    if not 4 <= at <= at + size <= footer_at:
        raise ValueError("only the pages are spliced")
    delta = len(data) - size
    metadata = Reader(raw, footer_at).struct()
    moved = lambda offset: offset + delta if offset > at else offset  # noqa: E731
    for group in metadata.get(4)[1]:
        grows = False
        for chunk in group.get(1)[1]:
            meta = chunk.get(3)
            start = meta.get(11) if meta.get(11) is not None else meta.get(9)
            holds = start <= at < start + meta.get(7)
            grows |= holds
            for fid in (9, 10, 11, 14):
                if meta.get(fid) is not None:
                    meta.set(fid, I64, moved(meta.get(fid)))
            if holds:
                meta.set(6, I64, meta.get(6) + delta)
                meta.set(7, I64, meta.get(7) + delta)
            for fid in (2, 4, 6):
                if chunk.get(fid) is not None:
                    chunk.set(fid, I64, moved(chunk.get(fid)))
        if group.get(5) is not None:
            group.set(5, I64, moved(group.get(5)))
        if grows:
            group.set(2, I64, group.get(2) + delta)
            if group.get(6) is not None:
                group.set(6, I64, group.get(6) + delta)
    encoded = encode_struct(metadata)
    path.write_bytes(raw[:at] + data + raw[at + size : footer_at] + encoded + len(encoded).to_bytes(4, "little") + b"PAR1")


def overwrite(path: Path, at: int, data: bytes) -> None:
    """``data`` over the bytes at ``at`` (no length changes)."""
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def footer(path: Path) -> Struct:
    """The file's FileMetaData."""
    raw = path.read_bytes()
    return Reader(raw, len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")).struct()


def replace_footer(path: Path, metadata: Struct | bytes) -> None:
    """The file with ``metadata`` (a struct, or its raw bytes) as its footer."""
    raw = path.read_bytes()
    encoded = metadata if isinstance(metadata, bytes) else encode_struct(metadata)
    at = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    path.write_bytes(raw[:at] + encoded + len(encoded).to_bytes(4, "little") + b"PAR1")
