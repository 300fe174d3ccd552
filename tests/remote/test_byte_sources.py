"""What every ByteSource answers, alike for a local folder and a bucket: whole files, sizes, a copy to
a local path, the listing, and batches of ranges whose failures are items, never raised."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3_server import S3Server

from imgpipe.errors import RemoteError
from imgpipe.storage.local import LocalSource
from imgpipe.storage.objectstore import ObjectStoreSource
from imgpipe.storage.opening import open_source
from imgpipe.storage.source import ByteRange, RangeError, is_url

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["local", "bucket"])
def source(request: pytest.FixtureRequest, packed_dir: Path):
    if request.param == "local":
        return open_source(packed_dir)
    request.getfixturevalue("s3_env")
    return open_source(request.getfixturevalue("remote_packed"))


def test_open_source_picks_the_source_by_location(s3_env: S3Server, packed_dir: Path, remote_packed: str) -> None:
    assert isinstance(open_source(packed_dir), LocalSource) and isinstance(open_source(remote_packed), ObjectStoreSource)
    assert is_url("s3://b/p") and is_url("https://host/x") and not is_url(str(packed_dir)) and not is_url(packed_dir)


def test_whole_files_sizes_copies_and_listing(source, packed_dir: Path, tmp_path: Path) -> None:
    names = sorted(p.name for p in packed_dir.iterdir() if p.is_file())
    assert source.list_names() == names
    assert source.read_file("manifest.json") == (packed_dir / "manifest.json").read_bytes()
    idxs = [n for n in names if n.endswith(".idx")]
    assert source.read_files(idxs) == [(packed_dir / n).read_bytes() for n in idxs]
    rec = next(n for n in names if n.endswith(".rec"))
    assert source.size(rec) == (packed_dir / rec).stat().st_size
    assert source.download(rec, tmp_path / "copy") == (packed_dir / rec).stat().st_size
    assert (tmp_path / "copy").read_bytes() == (packed_dir / rec).read_bytes()
    with pytest.raises(FileNotFoundError):
        source.read_file("no-such-file")
    with pytest.raises(FileNotFoundError):
        source.size("no-such-file")
    assert source.where(rec).endswith(f"/{rec}") and source.where(rec).startswith(source.location)


def test_a_batch_of_ranges_keeps_its_order_and_reports_failures_as_items(source, packed_dir: Path) -> None:
    rec = "train-00000-of-00002.rec"
    data = (packed_dir / rec).read_bytes()
    ranges = [ByteRange(rec, 100, 200), ByteRange("train-00001-of-00002.rec", 8, 64), ByteRange(rec, 0, 16), ByteRange(rec, 300, 400)]
    refused = {3}
    got = source.read_ranges(ranges, check=lambda k, view: "refused by the check" if k in refused else None)
    assert bytes(got[0]) == data[100:200] and bytes(got[2]) == data[0:16]
    assert bytes(got[1]) == (packed_dir / "train-00001-of-00002.rec").read_bytes()[8:64]
    assert isinstance(got[3], RangeError) and got[3].reason.startswith("refused by the check")
    assert str(got[3]).startswith(f"{source.where(rec)}: offset 300: refused by the check")
    assert bytes(source.read_range(rec, 5, 9)) == data[5:9]
    assert [bytes(v) for v in source.submit_ranges(ranges[:1]).result()] == [data[100:200]]


def test_a_range_past_the_end_of_its_file_is_an_item_not_an_exception(source, packed_dir: Path) -> None:
    rec = "train-00000-of-00002.rec"
    size = (packed_dir / rec).stat().st_size
    (got,) = source.read_ranges([ByteRange(rec, size - 4, size + 100)])
    assert isinstance(got, RemoteError) and "short" in str(got)
