"""Hostile downloads, a few KB each: every one is one line naming the archive (and the member), found at scan
time, within a memory and a time bound; what pack writes always passes its own verify.

- a tar member whose size moves the next header backward (a base-256 negative size, a pax ``size``): Python
  3.11.7's ``tarfile`` steps back onto the same header for ever (CVE-2025-8194); a long-name header claiming
  terabytes;
- a newline in an archive-level name (a class tar, a shard, a Parquet or ``.tar.gz`` file, a tar named one by one);
- a zip whose central directory places a member past the end of the file, or claims more bytes than it holds;
- the same part of a split train tar under two names, and a truncated last part.
- an empty (0-byte) tar or ``.tar.gz``: an empty file, not a tar cut after its first member.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from _cli import assert_one_line_error

from imgpipe.errors import DatasetError
from imgpipe.format.verify import verify
from imgpipe.ingest.scan import scan
from imgpipe.packing.packer import pack

MEMORY_LIMIT = 2 << 30  # address space of a pack subprocess: a listing that grows without end dies of it, not the machine
WNID = "n01440764"


def tiny_jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 40, 10)).save(buffer, "JPEG")
    return buffer.getvalue()


JPEG = tiny_jpeg()


def bounded_imgpipe(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``imgpipe ARGS`` in a subprocess held to MEMORY_LIMIT of address space and ``timeout`` seconds."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "imgpipe", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        env=dict(os.environ),
    )


def tar_of(members: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT, pax: dict[str, dict[str, str]] | None = None) -> bytearray:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            info.pax_headers = (pax or {}).get(name, {})
            archive.addfile(info, io.BytesIO(data))
    return bytearray(buffer.getvalue())


def set_size(tar: bytearray, name: str, size: int) -> bytearray:
    """The header of member ``name`` given ``size``, in base-256 (as GNU tar writes numbers octal cannot hold)."""
    at = tar.index(name.encode() + b"\0")
    assert at % 512 == 0
    field = (b"\xff" if size < 0 else b"\x80") + (size % 256**11).to_bytes(11, "big")
    tar[at + 124 : at + 136] = field
    tar[at + 148 : at + 156] = b" " * 8
    tar[at + 148 : at + 156] = b"%06o\0 " % sum(tar[at : at + 512])
    return tar


def shard(*keys: str) -> list[tuple[str, bytes]]:
    return [member for key in keys for member in ((f"{key}.jpg", JPEG), (f"{key}.cls", b"0"))]


def train_tar(class_tars: dict[str, bytes]) -> bytes:
    return bytes(tar_of(list(class_tars.items())))


# ----------------------------------------------------------------------------- tar headers that do not move forward


def negative_in_a_shard(src: Path) -> str:
    (src / "x-train-0000.tar").write_bytes(set_size(tar_of(shard("a", "b")), "b.cls", -512))
    return "x-train-0000.tar"


def negative_in_a_class_tar(src: Path) -> str:
    inner = set_size(tar_of([(f"{WNID}_1.JPEG", JPEG), (f"{WNID}_2.JPEG", JPEG)]), f"{WNID}_2.JPEG", -512)
    (src / "ILSVRC2012_img_train.tar").write_bytes(train_tar({f"{WNID}.tar": bytes(inner)}))
    return f"{WNID}.tar"


def negative_pax_size_in_a_shard(src: Path) -> str:
    # the pax header of b.cls is at byte 1024 (after a.jpg and a.cls); its size sends the next header back onto it
    members = [("a.jpg", JPEG), ("a.cls", b"0"), ("b.cls", b"0"), ("b.jpg", JPEG)]
    (src / "x-train-0000.tar").write_bytes(tar_of(members, tarfile.PAX_FORMAT, {"b.cls": {"size": str(-3 * 512)}}))
    return "x-train-0000.tar"


def huge_long_name_in_a_shard(src: Path) -> str:
    tar = tar_of([("a.jpg", JPEG), ("a.cls", b"0"), ("b.cls", b"0"), ("b" * 120 + ".jpg", JPEG)])  # a GNU long-name header
    (src / "x-train-0000.tar").write_bytes(set_size(tar, "././@LongLink", 1 << 40))
    return "x-train-0000.tar"


def negative_in_a_tar_gz(src: Path) -> str:
    (src / "data").mkdir()
    tar = set_size(tar_of([(f"a_{WNID}.JPEG", JPEG), (f"b_{WNID}.JPEG", JPEG)]), f"b_{WNID}.JPEG", -1024)
    (src / "data" / "train_images_0.tar.gz").write_bytes(gzip.compress(bytes(tar), mtime=0))
    return "train_images_0.tar.gz"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "make, what",
    [
        (negative_in_a_shard, "member b.cls has a negative size (-512)"),
        (negative_in_a_class_tar, f"member {WNID}_2.JPEG has a negative size (-512)"),
        (negative_pax_size_in_a_shard, "member b.cls has a size (-1536) that does not move the next header forward"),
        (huge_long_name_in_a_shard, "member ././@LongLink has a 1,099,511,627,776-byte extended header"),
        (negative_in_a_tar_gz, f"member b_{WNID}.JPEG has a negative size (-1024)"),
    ],
)
def test_a_tar_header_that_does_not_move_forward_is_one_line_naming_the_tar_and_the_member(make, what: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    archive = make(src)
    result = bounded_imgpipe("pack", src, tmp_path / "out", "--workers", "1", "--no-progress")
    assert_one_line_error(result, archive, what, "truncated or corrupt")
    assert not (tmp_path / "out" / "manifest.json").exists()


# ----------------------------------------------------------------------------- names with a newline


def newline_class_tar(src: Path) -> Path:
    members = {f"{WNID}.tar": bytes(tar_of([(f"{WNID}_1.JPEG", JPEG)])), f"{WNID}\nx.tar": bytes(tar_of([("y_1.JPEG", JPEG)]))}
    (src / "ILSVRC2012_img_train.tar").write_bytes(train_tar(members))
    return src


def newline_shard(src: Path) -> Path:
    (src / "x-train-0000.tar").write_bytes(tar_of(shard("a")))
    (src / "x-train-0001.tar\n").write_bytes(tar_of(shard("b")))
    return src


def newline_shard_named(src: Path) -> list[Path]:
    (src / "x\ny-train-0000.tar").write_bytes(tar_of(shard("a")))
    return [src / "x\ny-train-0000.tar"]


def newline_parquet(src: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (src / "data").mkdir()
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for name in ("train-00000-of-00002.parquet", "train-00001-of-00002.parquet\n"):
        table = pa.table({"image": pa.array([{"bytes": JPEG, "path": f"a_{WNID}.JPEG"}], image), "label": pa.array([0])})
        pq.write_table(table, src / "data" / name)
    return src


def newline_tar_gz(src: Path) -> Path:
    (src / "data").mkdir()
    (src / "data" / "train_images_0.tar.gz").write_bytes(gzip.compress(bytes(tar_of([(f"a_{WNID}.JPEG", JPEG)])), mtime=0))
    (src / "data" / "train_images_1.tar.gz\n").write_bytes(gzip.compress(bytes(tar_of([(f"b_{WNID}.JPEG", JPEG)])), mtime=0))
    return src


def newline_split_part(src: Path) -> Path:
    whole = train_tar({f"{WNID}.tar": bytes(tar_of([(f"{WNID}_1.JPEG", JPEG)]))})
    (src / "ILSVRC2012_img_train.tar.001").write_bytes(whole[:1024])
    (src / "ILSVRC2012_img_train.tar.002\n").write_bytes(whole[1024:])
    return src


def newline_tar_named(src: Path) -> list[Path]:
    (src / "ILSVRC2012_img\ntrain.tar").write_bytes(train_tar({f"{WNID}.tar": bytes(tar_of([(f"{WNID}_1.JPEG", JPEG)]))}))
    return [src / "ILSVRC2012_img\ntrain.tar"]


def newline_zip_named(src: Path) -> list[Path]:
    with zipfile.ZipFile(src / "kaggle\n.zip", "w") as archive:
        archive.writestr(f"ILSVRC/Data/CLS-LOC/train/{WNID}/{WNID}_1.JPEG", JPEG)
    return [src / "kaggle\n.zip"]


@pytest.mark.parametrize(
    "make, named",
    [
        (newline_class_tar, f"{WNID}\\nx.tar"),
        (newline_shard, "x-train-0001.tar\\n"),
        (newline_shard_named, "x\\ny-train-0000.tar"),
        (newline_parquet, "train-00001-of-00002.parquet\\n"),
        (newline_tar_gz, "train_images_1.tar.gz\\n"),
        (newline_split_part, "ILSVRC2012_img_train.tar.002\\n"),
        (newline_tar_named, "ILSVRC2012_img\\ntrain.tar"),
        (newline_zip_named, "kaggle\\n.zip"),
    ],
)
def test_a_newline_in_an_archive_level_name_is_one_line_not_a_pack_that_fails_verify(make, named: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    given = make(src)
    try:
        pack(given, tmp_path / "out", workers=1, progress=False)
    except DatasetError as e:
        assert named in str(e) and "newline" in str(e) and "\n" not in str(e), str(e)
    else:
        report = verify(tmp_path / "out", workers=1, progress=False)
        pytest.fail(f"packed; verify says {[str(p) for p in report.problems]}")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_member_named_with_a_newline_is_left_out_and_the_pack_passes_verify(tmp_path: Path) -> None:
    """The member level, as before: left out with the reason; what pack writes passes its own verify."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "ILSVRC2012_img_train.tar").write_bytes(
        train_tar({f"{WNID}.tar": bytes(tar_of([(f"{WNID}_1.JPEG", JPEG), ("a\nb.JPEG", JPEG)]))})
    )
    report = pack(src, tmp_path / "out", workers=1, progress=False)
    assert [s.path for s in report.skipped] == [f"ILSVRC2012_img_train.tar/{WNID}.tar/a\nb.JPEG"]
    assert verify(tmp_path / "out", workers=1, progress=False).ok


# ----------------------------------------------------------------------------- zip directories


def kaggle_zip(path: Path, stored: bool = False) -> zipfile.ZipInfo:
    """A two-member Kaggle-like zip; the info of its last member."""
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", method) as archive:
        for k in (1, 2):
            archive.writestr(f"ILSVRC/Data/CLS-LOC/train/{WNID}/{WNID}_{k}.JPEG", JPEG)
        return archive.infolist()[-1]


def patch_central_entry(path: Path, info: zipfile.ZipInfo, **fields: int) -> None:
    """Overwrite fields of ``info``'s central-directory entry: compress_size, file_size, header_offset."""
    at = {"compress_size": 20, "file_size": 24, "header_offset": 42}
    data = bytearray(path.read_bytes())
    entry = data.rindex(b"PK\x01\x02")  # the last member's entry
    for name, value in fields.items():
        data[entry + at[name] : entry + at[name] + 4] = value.to_bytes(4, "little")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "stored, fields, what",
    [
        (False, {"compress_size": 0xFFFF0000}, "past the end of the"),
        (False, {"header_offset": 0x7FFF0000}, "past the end of the"),
        (True, {"file_size": 0x7FFF0000}, "stored, but"),
        (False, {"file_size": 0xFFFF0000}, "deflated bytes cannot give"),
    ],
)
def test_a_zip_member_its_directory_places_past_the_end_or_overstates_is_one_line_at_scan_time(
    stored: bool, fields: dict[str, int], what: str, tmp_path: Path
) -> None:
    archive = tmp_path / "imagenet-object-localization-challenge.zip"
    patch_central_entry(archive, kaggle_zip(archive, stored), **fields)
    with pytest.raises(DatasetError) as caught:
        scan(archive)
    message = str(caught.value)
    assert str(archive) in message and f"member ILSVRC/Data/CLS-LOC/train/{WNID}/{WNID}_2.JPEG" in message and what in message
    assert "download the zip again" in message and "\n" not in message


def test_a_zip_member_past_the_end_under_a_memory_limit_is_the_same_line(tmp_path: Path) -> None:
    archive = tmp_path / "imagenet-object-localization-challenge.zip"
    patch_central_entry(archive, kaggle_zip(archive, stored=True), compress_size=0xFFFF0000, file_size=0xFFFF0000)
    result = bounded_imgpipe("pack", archive, tmp_path / "out", "--workers", "1", "--no-progress")
    assert_one_line_error(result, str(archive), "past the end of the", "download the zip again")


# ----------------------------------------------------------------------------- split train tars


def split_train_tar(src: Path, parts: int = 3) -> list[Path]:
    inner = {f"n0144076{k}.tar": bytes(tar_of([(f"n0144076{k}_{j}.JPEG", JPEG * 20) for j in range(3)])) for k in range(3)}
    whole = train_tar(inner)
    cuts = [len(whole) * k // parts for k in range(parts + 1)]
    paths = [src / f"ILSVRC2012_img_train.tar.{k + 1:03d}" for k in range(parts)]
    for k, path in enumerate(paths):
        path.write_bytes(whole[cuts[k] : cuts[k + 1]])
    return paths


def test_the_same_part_under_two_names_is_one_line_naming_both(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    parts = split_train_tar(src)
    (src / "ILSVRC2012_img_train.tar.02").write_bytes(parts[1].read_bytes())
    with pytest.raises(DatasetError) as caught:
        scan(src)
    both = f"{src / 'ILSVRC2012_img_train.tar.002'} and ILSVRC2012_img_train.tar.02"
    assert str(caught.value) == f"{both} are both part 2 of ILSVRC2012_img_train.tar; keep one of them"


def test_a_truncated_last_part_is_named(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    parts = split_train_tar(src)
    parts[-1].write_bytes(parts[-1].read_bytes()[: parts[-1].stat().st_size // 2])
    with pytest.raises(DatasetError) as caught:
        scan(src)
    assert "truncated or corrupt tar" in str(caught.value)
    assert str(caught.value).endswith("download ILSVRC2012_img_train.tar.003 again and rerun"), str(caught.value)


def test_a_damaged_part_is_named_where_the_damage_is_read(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    parts = split_train_tar(src)
    headers = [f"n0144076{k}_{j}.JPEG".encode() + b"\0" for k in range(3) for j in range(3)]
    part, at = next((p, data.index(h)) for p in parts[:-1] for h in headers if 0 <= (data := p.read_bytes()).find(h) < len(data) - 512)
    data = bytearray(part.read_bytes())
    data[at : at + 512] = b"\x07" * 512  # a class tar's member header, inside a part that is not the last
    part.write_bytes(bytes(data))
    with pytest.raises(DatasetError) as caught:
        scan(src)
    assert f"download {part.name} again" in str(caught.value), str(caught.value)


# ----------------------------------------------------------------------------- WebDataset sidecars


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "[" * 50_000 + "]" * 50_000])
def test_a_webdataset_json_label_json_accepts_but_no_integer_holds_is_one_line(value: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    members = [("a.jpg", JPEG), ("a.cls", b"0"), ("a.json", f'{{"label12k": {value}}}'.encode())]
    (src / "x-train-0000.tar").write_bytes(tar_of(members))
    info = {"splits": {"train": {"filenames": ["x-train-0000.tar"], "alt_label": "label12k"}}}
    (src / "_info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError) as caught:
        pack(src, tmp_path / "out", workers=1, progress=False)
    assert str(caught.value) == f"{src / 'x-train-0000.tar'}: member a.json: no integer 'label12k', the split's label in timm's _info.json"


@pytest.mark.parametrize("listed", ["../outside-train-0000.tar", "/tmp/outside-train-0000.tar", "sub/../../outside-train-0000.tar"])
def test_a_webdataset_info_that_lists_a_shard_outside_src_is_one_line_and_reads_nothing(listed: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "x-train-0000.tar").write_bytes(tar_of(shard("a")))
    (tmp_path / "outside-train-0000.tar").write_bytes(tar_of(shard("b")))
    (src / "_info.json").write_text(json.dumps({"splits": {"train": {"filenames": [listed]}}}))
    with pytest.raises(DatasetError) as caught:
        pack(src, tmp_path / "out", workers=1, progress=False)
    expected = f"{src / '_info.json'}: split 'train' lists {listed!r}, outside {src}; list the shards by their paths inside that folder"
    assert str(caught.value) == expected
    assert not (tmp_path / "out" / "manifest.json").exists()


# ----------------------------------------------------------------------------- empty files


def empty_val_tar(src: Path) -> list[Path]:
    (src / "ILSVRC2012_img_val.tar").write_bytes(b"")
    (src / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n")
    return [src]


def empty_val_tar_named(src: Path) -> list[Path]:
    return [empty_val_tar(src)[0] / "ILSVRC2012_img_val.tar", src / "LOC_val_solution.csv"]


def empty_class_tar(src: Path) -> list[Path]:
    (src / "ILSVRC2012_img_train.tar").write_bytes(train_tar({f"{WNID}.tar": b""}))
    return [src]


def empty_synset_tar(src: Path) -> list[Path]:
    (src / f"{WNID}.tar").write_bytes(bytes(tar_of([(f"{WNID}_1.JPEG", JPEG)])))
    (src / "n01443537.tar").write_bytes(b"")
    return [src]


def empty_shard(src: Path) -> list[Path]:
    (src / "x-train-0000.tar").write_bytes(bytes(tar_of(shard("a"))))
    (src / "x-train-0001.tar").write_bytes(b"")
    return [src]


def empty_tar_gz(src: Path) -> list[Path]:
    (src / "data").mkdir()
    (src / "data" / "train_images_0.tar.gz").write_bytes(b"")
    return [src]


@pytest.mark.parametrize(
    "make, named",
    [
        (empty_val_tar, "ILSVRC2012_img_val.tar: an empty file (0 bytes), not a tar; download ILSVRC2012_img_val.tar again"),
        (empty_val_tar_named, "ILSVRC2012_img_val.tar: an empty file (0 bytes), not a tar; download it again"),
        (empty_class_tar, f"ILSVRC2012_img_train.tar/{WNID}.tar: an empty file (0 bytes), not a tar; download ILSVRC2012_img_train.tar"),
        (empty_synset_tar, "n01443537.tar: an empty file (0 bytes), not a tar; download n01443537.tar again"),
        (empty_shard, "x-train-0001.tar: an empty file (0 bytes), not a tar; download x-train-0001.tar again"),
        (empty_tar_gz, "train_images_0.tar.gz: an empty file (0 bytes), not a .tar.gz; download it again"),
    ],
)
def test_an_empty_archive_is_called_an_empty_file(make, named: str, tmp_path: Path) -> None:
    """A 0-byte tar is an empty file, not a tar cut "after its first member"."""
    src = tmp_path / "src"
    src.mkdir()
    result = bounded_imgpipe("pack", *make(src), tmp_path / "out", "--workers", "1", "--no-progress")
    assert_one_line_error(result, named)
    assert "first member" not in result.stderr


@pytest.mark.timeout(60)
@pytest.mark.skipif(subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout.find("GNU tar") < 0, reason="GNU tar -S")
def test_a_sparse_member_is_named_as_such_not_as_a_truncated_tar(tmp_path: Path) -> None:
    """A member GNU tar stored sparse (-S) holds fewer bytes than its size: it was called 'truncated or corrupt tar:
    ends inside member ...; download it again', about a whole tar."""
    folder = tmp_path / "files"
    folder.mkdir()
    with open(folder / "a.jpg", "wb") as image:  # the JPEG's bytes with a 1 MiB hole inside: what tar -S stores sparse
        image.write(JPEG[:512])
        image.seek(512 + (1 << 20))
        image.write(JPEG[512:])
    (folder / "a.cls").write_text("0")
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(
        ["tar", "-S", "--format=gnu", "-cf", str(src / "imagenet1k-train-0000.tar"), "-C", str(folder), "a.jpg", "a.cls"], check=True
    )
    with tarfile.open(src / "imagenet1k-train-0000.tar") as archive:
        assert archive.getmember("a.jpg").issparse()  # the file system kept the hole, and tar stored it sparse
    with pytest.raises(DatasetError) as error:
        scan(src)
    assert str(error.value) == (
        f"{src / 'imagenet1k-train-0000.tar'}: member a.jpg is stored as a sparse file (GNU tar -S), which pack does not read in "
        "place (ImageNet's tars hold none): download imagenet1k-train-0000.tar again, or make it without -S"
    )
