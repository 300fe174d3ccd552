"""Hostile Parquet files (a few KB each): pack ends as pyarrow judges the file, with one line naming the file,
the row group and the column where pyarrow refuses it, or with the pack of what pyarrow reads; never a
traceback, and always within a memory bound (the process's address space) and a time bound.

Each file is one pyarrow wrote, then damaged: a count in a page header or a page, a Thrift field no
reader knows, a footer's claim, or a column of the wrong type.
"""

from __future__ import annotations

import io
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from _cli import assert_one_line_error

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from _parquet_surgery import (  # noqa: E402
    I32,
    I64,
    LIST,
    STRUCT,
    Struct,
    encode_struct,
    footer,
    overwrite,
    pages,
    replace_footer,
    replace_header,
    replace_page,
    varint,
)

ADDRESS_SPACE = 1 << 30  # RLIMIT_AS of each pack: a pack of these files needs about 100 MB
# Runs ARGV under an address-space limit and writes the peak RSS of it and its workers (a small process's
# children: a fork of pytest itself would count pytest's memory, until its exec, as the pack's).
BOUNDED = """
import resource, subprocess, sys
limit, peak, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
code = subprocess.call(argv)
open(peak, "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(code)
"""
PEAK_RSS = 400 << 20
TIME_LIMIT_S = 60
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
NAME = "train-00000-of-00001.parquet"
ROWS, ROW_GROUP = 12, 4


def jpeg(k: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(k).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def hf_table(**columns: "pa.Array") -> "pa.Table":
    """Hugging Face's layout: ``image`` {bytes, path} and ``label``, two classes named by the wnid in each path."""
    images = pa.array([{"bytes": jpeg(k), "path": f"img{k}_n0144076{k % 2}.JPEG"} for k in range(ROWS)], type=IMAGE)
    return pa.table(
        {"image": columns.get("image", images), "label": columns.get("label", pa.array([k % 2 for k in range(ROWS)], pa.int64()))}
    )


def write(folder: Path, table: "pa.Table" = None, **options: object) -> Path:
    path = folder / "data" / NAME
    path.parent.mkdir(parents=True)
    pq.write_table(hf_table() if table is None else table, path, row_group_size=ROW_GROUP, **options)
    return path


def pack_bounded(src: Path, dst: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """``imgpipe pack SRC DST`` in a process whose address space is ``ADDRESS_SPACE``; (its result, its peak RSS in bytes)."""
    peak = dst.parent / f"{dst.name}.peak"
    pack = [sys.executable, "-m", "imgpipe", "pack", str(src), str(dst), "--workers", "1", "--no-progress"]
    process = subprocess.Popen([sys.executable, "-c", BOUNDED, str(ADDRESS_SPACE), str(peak), *pack],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = process.communicate(timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"pack ran past {TIME_LIMIT_S} s: {err[-2000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), int(peak.read_text())


def shards(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name.endswith((".rec", ".idx", ".labels.npy"))}


# ----------------------------------------------------------------------------- the damage


def level_run(path: Path, header: bytes) -> None:
    """The definition levels of the first image.bytes page (no dictionary, uncompressed) start with run ``header``."""
    page = pages(path)[0]
    body = path.read_bytes()[page.body_at : page.body_at + page.body_size]
    levels = int.from_bytes(body[:4], "little")
    run = header + b"\x02"  # the run's value: 2, an image (the deepest definition level)
    replace_page(path, page, page.header, len(run).to_bytes(4, "little") + run + body[4 + levels :])


def huge_rle_run(path: Path) -> None:
    level_run(path, varint((1 << 27) << 1))  # an RLE run of 2^27 levels in a page of 4 values


def huge_bit_packed_run(path: Path) -> None:
    level_run(path, varint((1 << 21) << 1 | 1))  # 2^21 bit-packed groups of 8


DICTIONARY_PAGE_HEADER, DATA_PAGE_HEADER = 7, 5  # PageHeader's fields; each holds num_values as its field 1


def values_claimed(page_header: int, claim: int) -> Callable[[Path], None]:
    """The first image.bytes page claims ``claim`` values in its dictionary or data page header."""

    def damage(path: Path) -> None:
        page = pages(path)[0]
        page.header.get(page_header).set(1, I32, claim)
        replace_header(path, page, page.header)

    return damage


def unknown_field(value: bytes) -> Callable[[Path], None]:
    """A field no reader knows (id 15, after data_page_header's 5), holding ``value`` (its type nibble first)."""

    def damage(path: Path) -> None:
        page = pages(path)[1]  # the first data page, after the dictionary page
        kind, rest = value[0], value[1:]
        replace_header(path, page, encode_struct(page.header)[:-1] + bytes([(15 - 5) << 4 | kind]) + rest + b"\x00")

    return damage


def wrong_type_data_page_header(path: Path) -> None:
    page = pages(path)[0]
    page.header.set(5, I32, 7)  # an i32 where the data_page_header struct belongs
    replace_header(path, page, page.header)


def zeroed_page_header(path: Path) -> None:
    page = pages(path)[1]
    overwrite(path, page.at, bytes(page.header_size))


def rows_claimed(claim: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        metadata = footer(path)
        metadata.get(4)[1][0].set(3, I64, claim)  # row_groups[0].num_rows
        replace_footer(path, metadata)

    return damage


def row_groups_claimed(path: Path) -> None:
    """The footer's list of row groups claims 999,999 of them, and holds one."""
    metadata = footer(path)
    before = Struct([f for f in metadata.fields if f[0] < 4])
    head = encode_struct(before)[:-1] + bytes([(4 - 3) << 4 | LIST, 0xF0 | STRUCT]) + varint(999_999)
    replace_footer(path, head + encode_struct(metadata.get(4)[1][0]) + b"\x00")


MAP_OF_2_62_BOOLS = bytes([11]) + varint(1 << 62) + bytes([0x11])  # 9 bytes of map header: bool -> bool
NESTED_1000_DEEP = bytes([12]) + bytes([0x1C]) * 1000 + bytes(1001)  # a struct whose field 1 is a struct, 1,000 deep

RAW, PLAIN = dict(compression="none", use_dictionary=False), dict(use_dictionary=False)  # written without a dictionary page
CHUNK = "row group 0, column image.bytes"
# (damage, options pyarrow writes the file with, what pack must say: None where pyarrow reads the file whole)
CASES: dict[str, tuple[Callable[[Path], None], dict, list[str] | None]] = {
    "rle-run-of-2^27": (huge_rle_run, RAW, None),
    "bit-packed-run-of-2^21-groups": (huge_bit_packed_run, RAW, [CHUNK, "levels"]),
    "dictionary-of-2^33": (values_claimed(DICTIONARY_PAGE_HEADER, 1 << 33), {}, [CHUNK]),
    "dictionary-of-2^31-1": (values_claimed(DICTIONARY_PAGE_HEADER, (1 << 31) - 1), {}, [CHUNK]),
    "data-page-of-2^31": (values_claimed(DATA_PAGE_HEADER, 1 << 31), PLAIN, [CHUNK, "0 rows"]),
    "data-page-of-2^31-1": (values_claimed(DATA_PAGE_HEADER, (1 << 31) - 1), PLAIN, [CHUNK]),
    "unknown-map-of-2^62": (unknown_field(MAP_OF_2_62_BOOLS), {}, None),
    "structs-1000-deep": (unknown_field(NESTED_1000_DEEP), {}, [CHUNK, "Exceeded depth limit"]),
    "data-page-header-of-wrong-type": (wrong_type_data_page_header, PLAIN, [CHUNK]),
    "zeroed-page-header": (zeroed_page_header, {}, [CHUNK, "Invalid data; Deserializing page header failed."]),
    "row-group-of-2^40-rows": (rows_claimed(1 << 40), {}, ["row group 0 claims 1,099,511,627,776 rows in"]),
    "row-group-of-20-rows": (rows_claimed(20), {}, [f"{CHUNK}: 4 rows where the metadata claims 20"]),
    "999999-row-groups": (row_groups_claimed, {}, ["not a readable Parquet file", "Exceeded size limit"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def clean_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clean")
    write(folder / "src")
    result, _ = pack_bounded(folder / "src", folder / "out")
    assert result.returncode == 0, result.stderr
    return folder / "out"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_parquet_file_packs_as_pyarrow_reads_it_or_is_one_line(case: str, clean_pack: Path, tmp_path: Path) -> None:
    damage, options, fragments = CASES[case]
    path = write(tmp_path / "src", **options)
    damage(path)
    result, peak = pack_bounded(tmp_path / "src", tmp_path / "out")
    assert peak < PEAK_RSS, f"{peak >> 20} MB"
    if fragments is None:  # pyarrow reads every image as it was written
        assert result.returncode == 0, result.stderr
        assert shards(tmp_path / "out") == shards(clean_pack)
    else:
        assert_one_line_error(result, str(path), *fragments)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "column, values, holds, needs",
    [
        ("label", pa.array([0.5] * ROWS, pa.float64()), "double", "integers"),
        ("label", pa.array([math.nan] + [1.0] * (ROWS - 1), pa.float64()), "double", "integers"),  # pandas' int with a missing value
        ("label", pa.array(["cat"] * ROWS), "string", "integers"),
        ("image.path", None, "int64", "strings"),
        ("image.bytes", None, "string", "binary"),
    ],
)
def test_a_column_of_the_wrong_type_is_one_line_naming_it_and_the_type_it_needs(
    column: str, values: "pa.Array | None", holds: str, needs: str, tmp_path: Path
) -> None:
    if column == "label":
        table = hf_table(label=values)
    else:
        clean = hf_table().column("image").combine_chunks()
        bytes_, path = clean.field("bytes"), clean.field("path")
        fields = {"bytes": bytes_, "path": pa.array(range(ROWS), pa.int64())} if column == "image.path" else {
            "bytes": bytes_.cast(pa.string(), safe=False), "path": path}  # fmt: skip
        table = hf_table(image=pa.StructArray.from_arrays(list(fields.values()), list(fields)))
    path = write(tmp_path / "src", table)
    result, _ = pack_bounded(tmp_path / "src", tmp_path / "out")
    assert_one_line_error(result, str(path), f"column {column} holds {holds}; it needs {needs}")
    assert not list((tmp_path / "out").glob("*.rec"))


def test_a_label_past_int64_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "src", hf_table(label=pa.array([1 << 63] * ROWS, pa.uint64())))
    result, _ = pack_bounded(tmp_path / "src", tmp_path / "out")
    assert_one_line_error(result, str(path), "row group 0, row 0: label 9223372036854775808 is no class index")


def test_rows_past_the_end_of_a_file_changed_since_its_listing_are_named(tmp_path: Path) -> None:
    from imgpipe.errors import DatasetError
    from imgpipe.ingest.streams import StreamUnit

    path = write(tmp_path / "src", hf_table().slice(0, 4))
    with pytest.raises(DatasetError, match=r"has 4 rows, fewer than when it was listed; it changed since: rerun to list it again"):
        list(StreamUnit(path, parquet=True).read(np.array([0, 11]), np.zeros(2, np.int64)))
