"""Hugging Face's Parquet files through pyarrow: open one, and where each image of a row group lies."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from imgpipe._sys.oserrors import advice, describe
from imgpipe.errors import DatasetError
from imgpipe.ingest.parquetpages import ChunkReader, Images, Unsupported

IMAGE_COLUMN = "image"
INSTALL_HINT = "pip install 'imgpipe[parquet]'"


@functools.cache
def pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"reading Hugging Face Parquet files needs pyarrow: {INSTALL_HINT}") from None
    return pq


@contextlib.contextmanager
def open_parquet(path: Path) -> Iterator[Any]:
    """A ``pyarrow.parquet.ParquetFile``, closed on exit; an unreadable file is a DatasetError naming it."""
    pq = pyarrow_parquet()
    try:
        parquet = pq.ParquetFile(path)
    except OSError as e:
        if advice(e, writing=False):
            raise DatasetError(f"{path}: cannot read it: {describe(e, writing=False)}") from None
        raise DatasetError(f"{path}: not a readable Parquet file ({e}); download it again and rerun") from None
    except Exception as e:  # pyarrow's ArrowInvalid, ...
        raise DatasetError(f"{path}: not a readable Parquet file ({e}); download it again and rerun") from None
    try:
        yield parquet
    finally:
        parquet.close()


def read_rows(path: Path, wanted: np.ndarray) -> Iterator[tuple[int, bytes]]:
    with open_parquet(path) as parquet:
        starts = np.cumsum([0] + [parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups)])
        groups = np.searchsorted(starts, wanted, side="right") - 1
        pages = page_reader(path, parquet)
        for group in np.unique(groups).tolist():
            images = row_group_images(path, parquet, pages, group)
            for row in wanted[groups == group].tolist():
                yield row, images.image(row - int(starts[group]))


def page_reader(path: Path, parquet: Any) -> ChunkReader | None:
    """A reader of the file's ``image.bytes`` pages, or None when pyarrow must read them."""
    try:
        return ChunkReader(path, parquet.metadata, f"{IMAGE_COLUMN}.bytes")
    except (Unsupported, OSError, ValueError):  # an empty or unmappable file: pyarrow says what is wrong with it
        return None


def row_group_images(path: Path, parquet: Any, pages: ChunkReader | None, group: int) -> Images:
    """Where each image of row group ``group`` lies: from its pages, else (a layout they do not handle) read by pyarrow."""
    if pages is not None:
        try:
            return pages.read(group)
        except Unsupported:
            pass
    try:
        column = parquet.read_row_group(group, columns=[f"{IMAGE_COLUMN}.bytes"], use_threads=False).column(0)
    except Exception as e:  # pyarrow raises its own error types, OSError included
        raise DatasetError(f"{path}: row group {group} is unreadable ({e}); download the file again and rerun") from None
    begins, ends, data = image_bytes(column.chunk(0) if column.num_chunks == 1 else column.combine_chunks())
    return Images([data], np.zeros(len(begins), np.int32), begins, ends)


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
