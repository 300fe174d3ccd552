"""The Parquet page walker finds every image where pyarrow does, for the files writers make, and leaves to
pyarrow what it does not walk."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from imgpipe.ingest.parquet import image_bytes, page_reader, row_group_images  # noqa: E402
from imgpipe.ingest.parquetpages import ChunkReader, Unsupported  # noqa: E402

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def table(rows: int = 300, seed: int = 0) -> "pa.Table":
    """Images of every kind a reader must place: null rows, null and empty bytes, repeats (dictionary hits), sizes
    from 1 byte to 40 KB, and runs long enough for multi-byte RLE headers."""
    rng = np.random.default_rng(seed)
    images: list[dict | None] = []
    for k in range(rows):
        draw = rng.random()
        if draw < 0.05:
            images.append(None)
        elif draw < 0.1:
            images.append({"bytes": None, "path": f"p{k}"})
        elif draw < 0.15:
            images.append({"bytes": b"", "path": f"p{k}"})
        elif draw < 0.25 and k > 7 and images[k - 7]:
            images.append(images[k - 7])
        else:
            images.append({"bytes": rng.integers(0, 256, int(rng.integers(1, 40_000)), dtype=np.uint8).tobytes(), "path": f"p{k}"})
    images[100:200] = [{"bytes": b"same", "path": "s"}] * 100  # a long RLE run of one dictionary index
    return pa.table({"image": pa.array(images, type=IMAGE), "label": pa.array(range(rows), pa.int64())})


def pyarrow_images(path: Path, group: int) -> list[bytes]:
    column = pq.ParquetFile(path).read_row_group(group, columns=["image"]).column(0).combine_chunks()
    starts, ends, data = image_bytes(column)
    return [bytes(data[a:b]) for a, b in zip(starts, ends)]


@pytest.mark.parametrize(
    "compression, dictionary, version", list(itertools.product(["snappy", "zstd", "gzip", "brotli", "none"], [True, False], ["1.0", "2.0"]))
)
def test_every_image_is_where_pyarrow_reads_it(compression: str, dictionary: bool, version: str, tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    for row_group, page in ((37, 1 << 10), (300, 1 << 20)):  # many small pages; one row group of big pages and dictionary fall-back
        pq.write_table(table(), path, compression=compression, use_dictionary=dictionary, data_page_version=version,
                       row_group_size=row_group, data_page_size=page)  # fmt: skip
        parquet = pq.ParquetFile(path)
        reader = ChunkReader(path, parquet.metadata, "image.bytes")
        for group in range(parquet.metadata.num_row_groups):
            images = reader.read(group)
            expected = pyarrow_images(path, group)
            assert [images.image(k) for k in range(len(expected))] == expected
            assert images.sizes.tolist() == [len(x) for x in expected]


def test_what_it_does_not_walk_is_read_by_pyarrow(tmp_path: Path) -> None:
    """Hadoop's LZ4 codec and the DELTA_LENGTH_BYTE_ARRAY encoding: the same images, from pyarrow."""
    for name, options in (("lz4", dict(compression="lz4")),
                          ("delta", dict(use_dictionary=False, column_encoding={"image.bytes": "DELTA_LENGTH_BYTE_ARRAY"}))):  # fmt: skip
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table(), path, row_group_size=100, **options)
        parquet = pq.ParquetFile(path)
        with pytest.raises(Unsupported):
            ChunkReader(path, parquet.metadata, "image.bytes").read(0)
        pages = page_reader(path, parquet)
        for group in range(parquet.metadata.num_row_groups):
            images = row_group_images(path, parquet, pages, group)
            assert [images.image(k) for k in range(100)] == pyarrow_images(path, group)


def test_damaged_pages_read_as_pyarrow_reads_them(tmp_path: Path) -> None:
    """Zeros inside the images: both read the same bytes (neither checks page crc32s). Zeros over a page header:
    the walker gives up with no error of its own, pyarrow's read decides, and the pack says so in one line."""
    from imgpipe.errors import DatasetError

    path = tmp_path / "x.parquet"
    pq.write_table(table(), path, row_group_size=300, use_dictionary=False, data_page_size=1 << 10)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    original = path.read_bytes()
    for at, damage in ((chunk.data_page_offset + chunk.total_compressed_size // 2, "image"), (chunk.data_page_offset, "header")):
        data = bytearray(original)
        data[at : at + 64] = bytes(64)
        path.write_bytes(bytes(data))
        parquet = pq.ParquetFile(path)
        if damage == "image":
            images = ChunkReader(path, parquet.metadata, "image.bytes").read(0)
            assert [images.image(k) for k in range(300)] == pyarrow_images(path, 0)
        else:
            with pytest.raises(Unsupported):
                ChunkReader(path, parquet.metadata, "image.bytes").read(0)
            with pytest.raises(DatasetError, match="x.parquet: row group 0 is unreadable"):
                row_group_images(path, parquet, page_reader(path, parquet), 0)
