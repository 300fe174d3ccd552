"""Hugging Face's Parquet files, read by pyarrow alone: open one, check its columns' types, and read a
row group's images (slices of its ``image.bytes`` buffer, no copy per row) and other columns.

pyarrow's judgement on a file is the only one: whatever it refuses is one DatasetError naming the file
and the row group. Two counts pyarrow would trust are bounded first by the bytes that hold them:
a Thrift string or container in a header is no longer than the file, and a row group claims no more
rows than it has bytes (pyarrow sizes its buffers by that claim). A row group that reads as another
number of rows than its metadata claims is refused, so no image lands in another row's place.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from imgpipe._sys.oserrors import advice, describe
from imgpipe.errors import DatasetError

IMAGE_COLUMN = "image"
BYTES_COLUMN, PATH_COLUMN, LABEL_COLUMN = f"{IMAGE_COLUMN}.bytes", f"{IMAGE_COLUMN}.path", "label"
INSTALL_HINT = "pip install 'imgpipe[parquet]'"
THRIFT_STRING_LIMIT, THRIFT_CONTAINER_LIMIT = 100_000_000, 1_000_000  # pyarrow's own defaults
INT64_MAX = (1 << 63) - 1
MESSAGE_CHARS = 300  # of pyarrow's message, in the one line


@functools.cache
def pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"reading Hugging Face Parquet files needs pyarrow: {INSTALL_HINT}") from None
    return pq


def one_line(error: BaseException) -> str:
    """pyarrow's message (some span several lines) as one line."""
    text = "; ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


@contextlib.contextmanager
def open_parquet(path: Path) -> Iterator[Any]:
    """A ``pyarrow.parquet.ParquetFile`` whose row counts are bounded by its size, closed on exit; an unreadable
    file is a DatasetError naming it."""
    pq = pyarrow_parquet()
    try:
        size = os.stat(path).st_size
        limits = dict(thrift_string_size_limit=max(1, min(size, THRIFT_STRING_LIMIT)),
                      thrift_container_size_limit=max(1, min(size, THRIFT_CONTAINER_LIMIT)))  # fmt: skip
        parquet = pq.ParquetFile(path, memory_map=True, **limits)  # pages are decompressed from the page cache, not from a copy
    except OSError as e:
        if advice(e, writing=False):
            raise DatasetError(f"{path}: cannot read it: {describe(e, writing=False)}") from None
        raise DatasetError(f"{path}: not a readable Parquet file ({one_line(e)}); download it again and rerun") from None
    except Exception as e:  # pyarrow's ArrowInvalid, ArrowMemoryError, ...
        raise DatasetError(f"{path}: not a readable Parquet file ({one_line(e)}); download it again and rerun") from None
    try:
        _check_row_counts(path, parquet.metadata)
        yield parquet
    finally:
        parquet.close()


def release_memory() -> None:
    """Hand the memory pyarrow's pool keeps for reuse back to the OS."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _check_row_counts(path: Path, metadata: Any) -> None:
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group)
        held = sum(max(0, rows.column(c).total_compressed_size) for c in range(rows.num_columns))
        if not 0 <= rows.num_rows <= held:
            raise DatasetError(
                f"{path}: row group {group} claims {rows.num_rows:,} rows in {held:,} bytes; not a readable Parquet file: "
                "download it again and rerun"
            )


def check_columns(path: Path, schema: Any) -> bool:
    """The columns a Hugging Face image-classification file must have, each of the type it needs; True when
    ``image.path`` is there."""
    import pyarrow as pa

    image = schema.field(IMAGE_COLUMN).type if IMAGE_COLUMN in schema.names else None
    if not pa.types.is_struct(image) or image.get_field_index("bytes") < 0 or LABEL_COLUMN not in schema.names:
        raise DatasetError(f"{path}: no image.bytes and label columns; is this a Hugging Face image-classification Parquet file?")
    needs = [(BYTES_COLUMN, image.field("bytes").type, (pa.types.is_binary, pa.types.is_large_binary), "binary (the image's bytes)"),
             (LABEL_COLUMN, schema.field(LABEL_COLUMN).type, (pa.types.is_integer,), "integers (class indices)")]  # fmt: skip
    with_path = image.get_field_index("path") >= 0
    if with_path:
        needs.append((PATH_COLUMN, image.field("path").type, (pa.types.is_string, pa.types.is_large_string), "strings (file names)"))
    for name, kind, accepted, wanted in needs:
        if not any(accepts(kind) for accepts in accepted):
            raise DatasetError(f"{path}: column {name} holds {kind}; it needs {wanted}, as Hugging Face's datasets writes it")
    return with_path


def read_row_group(path: Path, parquet: Any, group: int, columns: list[str]) -> Any:
    """``columns`` of row group ``group`` as a pyarrow Table, exactly as many rows as its metadata claims."""
    where = f"{path}: row group {group}, column {', '.join(columns)}"
    try:
        table = parquet.read_row_group(group, columns=columns, use_threads=False)
    except Exception as e:  # pyarrow raises its own error types, OSError and MemoryError included
        raise DatasetError(f"{where}: unreadable ({one_line(e)}); download the file again and rerun") from None
    claimed = parquet.metadata.row_group(group).num_rows
    if table.num_rows != claimed:
        raise DatasetError(f"{where}: {table.num_rows:,} rows where the metadata claims {claimed:,}; download the file again and rerun")
    return table


def label_values(path: Path, table: Any, group: int) -> list[int]:
    """The ``label`` column of a row group read by ``read_row_group``: -1 where it is null (no label)."""
    values = table.column(LABEL_COLUMN).to_pylist()
    beyond = next((k for k, label in enumerate(values) if label is not None and label > INT64_MAX), None)
    if beyond is not None:
        raise DatasetError(f"{path}: row group {group}, row {beyond}: label {values[beyond]} is no class index (more than 2^63 - 1)")
    return [-1 if label is None else label for label in values]


@dataclass
class Images:
    """Image k of a row group is ``data[starts[k]:ends[k]]``: empty where the image or its bytes are null."""

    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    data: memoryview

    @property
    def sizes(self) -> np.ndarray:
        return self.ends - self.starts

    def image(self, k: int) -> bytes:
        return bytes(self.data[int(self.starts[k]) : int(self.ends[k])])


def row_group_images(path: Path, parquet: Any, group: int) -> Images:
    """Where each image of row group ``group`` lies in the ``image.bytes`` buffer pyarrow reads."""
    column = read_row_group(path, parquet, group, [BYTES_COLUMN]).column(IMAGE_COLUMN)
    return Images(*image_bytes(column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()))


def struct_field(column: Any, name: str) -> Any:
    """Field ``name`` of a struct column (a pyarrow ChunkedArray) as one array."""
    return (column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()).field(name)


def image_bytes(column: Any) -> tuple[np.ndarray, np.ndarray, memoryview]:
    """Where each image of an ``image`` struct column lies in its ``bytes`` buffer: image k is
    ``data[starts[k]:ends[k]]``, empty where the image or its bytes are null. Slicing the buffer
    costs less than a pyarrow scalar per row."""
    values = column.field("bytes")
    width = np.int64 if str(values.type).startswith("large_") else np.int32
    offsets = np.frombuffer(values.buffers()[1], width)[values.offset : values.offset + len(values) + 1].astype(np.int64)
    starts, ends = offsets[:-1].copy(), offsets[1:].copy()
    null = ~(np.asarray(column.is_valid()) & np.asarray(values.is_valid()))
    ends[null] = starts[null]
    return starts, ends, memoryview(values.buffers()[2] or b"")


def read_rows(path: Path, wanted: np.ndarray) -> Iterator[tuple[int, bytes]]:
    """(row, image bytes) of each of the sorted ``wanted`` rows, reading only the row groups that hold them."""
    with open_parquet(path) as parquet:
        metadata = parquet.metadata
        starts = np.cumsum([0] + [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
        if len(wanted) and int(wanted[-1]) >= starts[-1]:
            raise DatasetError(
                f"{path}: has {int(starts[-1]):,} rows, fewer than when it was listed; it changed since: rerun to list it again"
            )
        groups = np.searchsorted(starts, wanted, side="right") - 1
        for group in np.unique(groups).tolist():
            images = row_group_images(path, parquet, group)
            for row in wanted[groups == group].tolist():
                yield row, images.image(row - int(starts[group]))
