"""Property: a Kaggle zip whose central directory or end record is damaged anywhere (offsets, sizes, counts, name
and extra lengths, methods, flags) is scanned and read, or refused in one line, within a memory and a time bound.
No count the directory gives is trusted beyond the bytes of the zip."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
from _bounded import allocated_by
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgpipe.errors import DatasetError
from imgpipe.ingest.kaggle_zip import scan_zip
from imgpipe.ingest.members import member_reader

WNID = "n01440764"
CENTRAL = struct.Struct("<4s4B4HL2L5H2L")  # zipfile's structCentralDir
END = struct.Struct("<4s4H2LH")  # zipfile's structEndArchive
CENTRAL_FIELDS = {"flags": 5, "method": 6, "crc": 9, "compress_size": 10, "file_size": 11, "name_length": 12,
                  "extra_length": 13, "comment_length": 14, "external_attr": 17, "header_offset": 18}  # fmt: skip
END_FIELDS = {"entries_here": 3, "entries": 4, "directory_size": 5, "directory_offset": 6, "comment_length": 7}
WORDS = st.sampled_from([0, 1, 2, 8, 46, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFF0000]) | st.integers(0, 2**32 - 1)


def kaggle_zip() -> bytes:
    """Train images (stored and deflated), a flat val with its CSV, and a symbolic link: every kind of member scan reads."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for k in range(3):
            method = zipfile.ZIP_DEFLATED if k % 2 else zipfile.ZIP_STORED
            archive.writestr(f"ILSVRC/Data/CLS-LOC/train/{WNID}/{WNID}_{k}.JPEG", b"\xff\xd8" + bytes([k]) * 300 + b"\xff\xd9", method)
        archive.writestr("ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_00000001.JPEG", b"\xff\xd8" + b"v" * 200 + b"\xff\xd9")
        archive.writestr("LOC_val_solution.csv", f"ImageId,PredictionString\nILSVRC2012_val_00000001,{WNID} 1 2 3 4\n")
        link = zipfile.ZipInfo(f"ILSVRC/Data/CLS-LOC/train/{WNID}/link.JPEG")
        link.external_attr = (0o120777 << 16) | 0
        archive.writestr(link, f"{WNID}_0.JPEG")
    return buffer.getvalue()


ZIP = kaggle_zip()
ENTRIES = [at for at in range(len(ZIP)) if ZIP.startswith(b"PK\x01\x02", at)]
END_AT = ZIP.rindex(b"PK\x05\x06")


@st.composite
def damaged_zips(draw: st.DrawFn) -> bytes:
    data = bytearray(ZIP)
    kinds = draw(st.lists(st.sampled_from(["central", "central", "end", "flip", "truncate"]), min_size=1, max_size=3))
    for kind in sorted(kinds, key=lambda kind: kind == "truncate"):  # fields first, then the cut
        if kind == "central":
            at = draw(st.sampled_from(ENTRIES))
            fields = list(CENTRAL.unpack_from(data, at))
            field = CENTRAL_FIELDS[draw(st.sampled_from(sorted(CENTRAL_FIELDS)))]
            fields[field] = draw(WORDS) % (1 << (32 if field in (9, 10, 11, 17, 18) else 16))
            CENTRAL.pack_into(data, at, *fields)
        elif kind == "end":
            fields = list(END.unpack_from(data, END_AT))
            field = END_FIELDS[draw(st.sampled_from(sorted(END_FIELDS)))]
            fields[field] = draw(WORDS) % (1 << (32 if field in (5, 6) else 16))
            END.pack_into(data, END_AT, *fields)
        elif kind == "flip":
            at = draw(st.integers(min(ENTRIES), len(data) - 1))
            data[at] ^= draw(st.integers(1, 255))
        else:
            del data[draw(st.integers(len(data) // 2, len(data) - 1)) :]
    return bytes(data)


def read_all(path: Path) -> None:
    """Scan the zip and read every item it lists: each is bytes, a reason it has none, or a DatasetError."""
    tree = scan_zip(path, None)
    for items in tree.splits.values():
        with member_reader(items.spans) as read:  # type: ignore[arg-type]
            for k, name in enumerate(items.paths):
                read(k, name)


@pytest.mark.timeout(300)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=damaged_zips())
def test_a_damaged_zip_directory_is_read_or_one_line_within_bounds(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "imagenet-object-localization-challenge.zip"
    path.write_bytes(data)
    peak = allocated_by(lambda: read_all(path), DatasetError)
    assert peak < 4 << 20, f"a {len(data):,}-byte zip allocated {peak:,} bytes"
