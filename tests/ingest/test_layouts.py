"""Packing ImageNet as people download it today, read in place: Kaggle's zip, Hugging Face's Parquet files
and tarballs, timm's WebDataset shards, image-net.org's train tar in parts.

For each layout, on the same synthetic images (6 classes, quirks, val): the shards are
byte-identical to the extracted tree's (.rec, .idx, labels, crc32), kill -9 and a rerun give
the same bytes, and a broken download is one line naming the archive.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _cli import assert_one_line_error, kill_once_durable, slow_pack_command

from imgpipe.format.manifest import load_manifest
from imgpipe.ingest.classnames import ilsvrc2012_wnids, names_for_indices
from imgpipe.ingest.scan import scan
from imgpipe.packing.journal import JOURNAL_DIR
from imgpipe.packing.packer import PackReport, pack
from imgpipe.synth.layouts import LAYOUTS
from imgpipe.synth.tree import make_synthetic

SYNTH = dict(classes=6, per_class=5, val_per_class=2, seed=7, quirks=True, min_side=32, max_side=64, progress=False)
ARCHIVES = ("split-tar", "hf-tar", "hf-parquet", "wds", "kaggle-zip")
STREAMS = ("hf-tar", "hf-parquet")
COMPARED = (".rec", ".idx", ".labels.npy", ".crc32.npy", ".index.npy")


def imgpipe(*args: object, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "imgpipe", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def shard_files(dst: Path) -> dict[str, bytes]:
    """What must be byte-identical: every .rec, .idx, labels, crc32 and index sidecar."""
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name.endswith(COMPARED)}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same synthetic images as a tree and in every archive layout, in ``base/<layout>``."""
    base = tmp_path_factory.mktemp("layouts")
    make_synthetic(base / "tree", **SYNTH)
    for layout in ARCHIVES:
        make_synthetic(base / layout, layout=layout, **SYNTH)
    return base


@pytest.fixture(scope="module")
def tree_report(datasets: Path, tmp_path_factory: pytest.TempPathFactory) -> PackReport:
    dst = tmp_path_factory.mktemp("tree-pack") / "out"
    return pack(datasets / "tree", dst, shards="train=3,val=2", workers=2, progress=False)


@pytest.fixture(scope="module")
def tree_pack(tree_report: PackReport) -> Path:
    return tree_report.dst


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", ARCHIVES)
@pytest.mark.parametrize("workers", [1, 2])
def test_layout_packs_byte_identical_to_the_extracted_tree(
    layout: str, workers: int, datasets: Path, tree_pack: Path, tree_report: PackReport, tmp_path: Path
) -> None:
    report = pack(datasets / layout, tmp_path / "out", shards="train=3,val=2", workers=workers, progress=False)
    assert shard_files(tmp_path / "out") == shard_files(tree_pack)
    assert len(shard_files(tree_pack)) == 2 * 5 + 6
    tree, packed = load_manifest(tree_pack), load_manifest(tmp_path / "out")
    assert packed.layout == layout and tree.layout == "imagenet"
    assert packed.options == tree.options
    assert packed.classes == tree.classes  # wds: the wnids the samples' .json filenames name
    assert [s.reason for s in report.skipped] == [s.reason for s in tree.skipped]
    assert {s.reason for s in report.skipped} == {"empty file", "truncated JPEG (no EOI marker)", "not an image"}
    assert report.actions == tree_report.actions and report.actions["repaired"] == 5 and report.repairs == tree_report.repairs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", STREAMS)
def test_stream_layouts_resized_and_with_one_shard_per_record(layout: str, datasets: Path, tmp_path: Path) -> None:
    """--resize makes every record shorter than its slot (compaction); one record per shard is the other extreme."""
    for options in (dict(shards="train=2,val=1", resize=24), dict(shards="train=53,val=12")):
        tree = pack(datasets / "tree", tmp_path / "tree", workers=2, progress=False, overwrite=True, **options)  # type: ignore[arg-type]
        packed = pack(datasets / layout, tmp_path / "out", workers=2, progress=False, overwrite=True, **options)  # type: ignore[arg-type]
        assert shard_files(tmp_path / "out") == shard_files(tmp_path / "tree")
        assert packed.records == tree.records


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", STREAMS)
@pytest.mark.parametrize("how", ["empty", "a bit flipped"])
def test_a_damaged_listing_cache_is_listed_again(
    layout: str, how: str, datasets: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kept listing whose bytes are damaged (numpy's EOFError, zipfile's BadZipFile) is listed again, not a traceback."""
    cache = tmp_path / "listings"
    first = scan(datasets / layout, workers=1, cache=cache)
    for kept in cache.iterdir():
        data = bytearray(kept.read_bytes())
        data[len(data) // 2] ^= 0xFF
        kept.write_bytes(b"" if how == "empty" else bytes(data))
    with caplog.at_level(logging.INFO):
        again = scan(datasets / layout, workers=1, cache=cache)
    assert "unreadable listing cache, listing again" in caplog.text
    assert {name: split.paths for name, split in again.splits.items()} == {name: split.paths for name, split in first.splits.items()}


def test_verify_decodes_a_pack_from_parquet(datasets: Path, tmp_path: Path) -> None:
    assert imgpipe("pack", datasets / "hf-parquet", tmp_path / "out", "--workers", "2").returncode == 0
    verified = imgpipe("verify", tmp_path / "out", "--decode", "--workers", "2")
    assert verified.returncode == 0 and ": OK: checked and decoded" in verified.stdout, verified.stdout + verified.stderr
    info = imgpipe("info", tmp_path / "out")
    assert "hf-parquet layout" in info.stdout and "data/train-00000-of-00002.parquet/" in info.stdout, info.stdout


def test_files_named_one_by_one(datasets: Path, tree_pack: Path, tmp_path: Path) -> None:
    parts = sorted((datasets / "split-tar").glob("ILSVRC2012_img_train.tar.0*"))
    named = imgpipe("pack", *parts, datasets / "split-tar" / "ILSVRC2012_img_val.tar", tmp_path / "split", "--shards", "train=3,val=2")
    assert named.returncode == 0, named.stderr
    assert shard_files(tmp_path / "split") == shard_files(tree_pack)
    shards = sorted(datasets.joinpath("wds").glob("*.tar"))
    named = imgpipe("pack", *shards, tmp_path / "wds", "--shards", "train=3,val=2")
    assert named.returncode == 0, named.stderr
    assert shard_files(tmp_path / "wds") == shard_files(tree_pack)
    zipped = imgpipe(
        "pack", datasets / "kaggle-zip" / "imagenet-object-localization-challenge.zip", tmp_path / "zip", "--shards", "train=3,val=2"
    )
    assert zipped.returncode == 0, zipped.stderr
    assert shard_files(tmp_path / "zip") == shard_files(tree_pack)
    for layout, pattern in (("hf-parquet", "*.parquet"), ("hf-tar", "*.tar.gz")):
        files = sorted((datasets / layout / "data").glob(pattern))
        named = imgpipe("pack", *files, tmp_path / layout, "--shards", "train=3,val=2")
        assert named.returncode == 0, named.stderr
        assert shard_files(tmp_path / layout) == shard_files(tree_pack) and load_manifest(tmp_path / layout).layout == layout
        assert (tmp_path / layout / "train.sources.txt").read_text().split("/", 1)[0] in {f.name for f in files}  # relative to data/


def test_a_gap_in_the_parts_of_the_train_tar_is_one_line_naming_the_missing_part(datasets: Path, tmp_path: Path) -> None:
    src = copy_layout(datasets, "split-tar", tmp_path / "src")
    (src / "ILSVRC2012_img_train.tar.003").unlink()
    assert_one_line_error(imgpipe("pack", src, tmp_path / "out"), "ILSVRC2012_img_train.tar: part .003 is missing", "download every part")
    parts = sorted(src.glob("ILSVRC2012_img_train.tar.0*"))
    assert [p.suffix for p in parts] == [".001", ".002", ".004"]
    named = imgpipe("pack", *parts, src / "ILSVRC2012_img_val.tar", tmp_path / "named")
    assert_one_line_error(named, "ILSVRC2012_img_train.tar: part .003 is missing", "download every part")


# ----------------------------------------------------------------------------- kill -9 and resume


@pytest.fixture(scope="module")
def slow_datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Larger images, so that a resizing pack takes long enough to be killed in the middle."""
    base = tmp_path_factory.mktemp("slow")
    options = dict(SYNTH, per_class=12, min_side=120, max_side=200)
    make_synthetic(base / "tree", **options)  # type: ignore[arg-type]
    for layout in ARCHIVES:
        make_synthetic(base / layout, layout=layout, **options)  # type: ignore[arg-type]
    return base


def checkpointed(dst: Path) -> int:
    """Records a pack's checkpoint says are written in shards not yet journaled (0 without one): what a rerun keeps."""
    try:
        with np.load(dst / JOURNAL_DIR / "checkpoint-node0.npz") as checkpoint:
            names, shards = json.loads(checkpoint["meta"].tobytes())["shards"], checkpoint["shard"].tolist()
    except (OSError, ValueError, KeyError):
        return 0
    journaled = {path.name[: -len(".json")] for path in (dst / JOURNAL_DIR).glob("*-of-*.json")}
    return sum(names[k] not in journaled for k in shards)


def tar_data_ends(path: Path) -> tuple[list[int], int]:
    """Where each regular member's data ends in the decompressed ``.tar.gz`` (by ordinal), and the tar's length."""
    with tarfile.open(path) as tar:
        ends = [m.offset_data + m.size for m in tar if m.isreg()]
    return ends, len(gzip.decompress(path.read_bytes()))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ("tree", *ARCHIVES))
def test_kill_then_resume_is_byte_identical(layout: str, slow_datasets: Path, tmp_path: Path) -> None:
    """Killed at the first moment some work is durable (a checkpoint of written records), the rerun resumes: it writes
    only the shards not journaled and reads only the records not checkpointed; a .tar.gz only up to the member of its
    last such record."""
    env = {**os.environ, "STREAM_SPY_LOG": str(tmp_path / "reads.jsonl")}
    every = ("--checkpoint-every", "0")
    subprocess.run(slow_pack_command(slow_datasets / "tree", tmp_path / "reference"), check=True, capture_output=True, timeout=240)
    dst = tmp_path / "out"
    journaled = lambda: len(list((dst / JOURNAL_DIR).glob("*-of-*.json")))  # noqa: E731
    shards = len([name for name in shard_files(tmp_path / "reference") if name.endswith(".rec")])
    for _ in range(5):  # a kill that lands once every shard is journaled (a loaded machine let the pack run on) leaves nothing to resume
        shutil.rmtree(dst, ignore_errors=True)
        kill_once_durable(slow_pack_command(slow_datasets / layout, dst, ("-m", "imgpipe"), *every), lambda: checkpointed(dst) > 0, env)
        if journaled() < shards:
            break
    assert journaled() < shards, "every kill landed after the last shard was journaled"
    assert not (dst / "manifest.json").exists()
    done_shards = journaled()
    spy = (str(Path(__file__).parent / "_stream_spy.py"),) if layout == "hf-tar" else ("-m", "imgpipe")
    command = slow_pack_command(slow_datasets / layout, dst, spy, *every)
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr
    assert shard_files(dst) == shard_files(tmp_path / "reference")
    assert not [p for p in dst.rglob("*") if p.name.endswith(".tmp")]
    writing = re.search(r"writing (\d+) shard\(s\) of (\d+)", result.stderr)
    assert writing and int(writing[1]) == int(writing[2]) - done_shards, result.stderr  # journaled shards are not written again
    resumed = re.search(r"resuming: (\d+) of (\d+) records were written before", result.stderr)
    assert resumed and 0 < int(resumed[1]) < int(resumed[2]), result.stderr
    assert not (dst / JOURNAL_DIR / "slots").exists() and not (dst / JOURNAL_DIR / "checkpoint-node0.npz").exists()
    if layout == "hf-tar":
        reads = [json.loads(line) for line in (tmp_path / "reads.jsonl").read_text().splitlines()]
        assert sum(len(read["wanted"]) for read in reads) == int(resumed[2]) - int(resumed[1])  # no written record is read again
        for read in reads:
            ends, length = tar_data_ends(Path(read["unit"]))
            assert read["position"] == ends[max(read["wanted"])] < length, read  # stopped at the last record not written


# ----------------------------------------------------------------------------- broken downloads


def copy_layout(datasets: Path, layout: str, folder: Path) -> Path:
    shutil.copytree(datasets / layout, folder)
    return folder


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "layout, victim, fragments",
    [
        ("split-tar", "ILSVRC2012_img_train.tar.004", ["ILSVRC2012_img_train.tar", "truncated or corrupt tar"]),
        ("hf-tar", "data/train_images_2.tar.gz", ["train_images_2.tar.gz", "truncated or corrupt .tar.gz", "download it again"]),
        ("hf-parquet", "data/train-00001-of-00002.parquet", ["train-00001-of-00002.parquet", "not a readable Parquet file"]),
        ("wds", "imagenet1k-train-0002.tar", ["imagenet1k-train-0002.tar", "truncated or corrupt tar"]),
        ("kaggle-zip", "imagenet-object-localization-challenge.zip", ["imagenet-object-localization-challenge.zip", "not a readable zip"]),
    ],
)
def test_a_truncated_archive_is_one_line(layout: str, victim: str, fragments: list[str], datasets: Path, tmp_path: Path) -> None:
    src = copy_layout(datasets, layout, tmp_path / "src")
    truncate(src / victim)
    assert_one_line_error(imgpipe("pack", src, tmp_path / "out", "--workers", "2", "--no-progress"), *fragments)


def test_a_corrupt_zip_member_is_one_line_and_what_was_written_stays(datasets: Path, tree_pack: Path, tmp_path: Path) -> None:
    """The member read last (the zip is read front to back) is corrupt: every shard without it is published, the other
    records of its shard are checkpointed, and the rerun after a new download reads that member alone."""
    src = copy_layout(datasets, "kaggle-zip", tmp_path / "src")
    archive = src / "imagenet-object-localization-challenge.zip"
    good = archive.read_bytes()
    sources = {
        f"ILSVRC/Data/CLS-LOC/{line}" for split in ("train", "val") for line in (tree_pack / f"{split}.sources.txt").read_text().split()
    }
    with zipfile.ZipFile(archive) as z:
        info = max((i for i in z.infolist() if i.filename in sources and i.compress_size >= 32), key=lambda i: i.header_offset)
    data = bytearray(good)
    at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.compress_size // 2
    data[at : at + 16] = bytes(16)
    archive.write_bytes(bytes(data))
    args = ("pack", src, tmp_path / "out", "--workers", "1", "--shards", "train=3,val=2", "--no-progress")
    result = imgpipe(*args)
    assert_one_line_error(
        result, f"imagenet-object-localization-challenge.zip/{info.filename}", "corrupt zip member", "download the zip again"
    )
    assert len(list((tmp_path / "out" / JOURNAL_DIR).glob("*-of-*.json"))) == 4
    archive.write_bytes(good)  # downloaded again
    rerun = imgpipe(*args)
    assert rerun.returncode == 0, rerun.stderr
    resumed = re.search(r"resuming: (\d+) of (\d+) records were written before", rerun.stderr)
    assert resumed and int(resumed[1]) == int(resumed[2]) - 1, rerun.stderr
    assert shard_files(tmp_path / "out") == shard_files(tree_pack)


def test_a_webdataset_sample_with_a_label_but_no_image_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in (("a.jpg", b"\xff\xd8"), ("a.cls", b"0"), ("b.cls", b"1"), ("b.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    (src / "mine-train-0000.tar").write_bytes(buffer.getvalue())
    assert_one_line_error(imgpipe("pack", src, tmp_path / "out"), "mine-train-0000.tar", "member b.cls", "a .cls label but no .jpg")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["isal", "zlib"])
def test_gzip_and_deflate_read_alike_with_isal_or_zlib(backend: str, datasets: Path, tree_pack: Path, tmp_path: Path) -> None:
    """ISA-L inflates when python-isal (the fast extra) is installed, zlib when it is not: the same shards from the
    .tar.gz and the deflated zip, and a truncated .tar.gz is the same one line."""
    if backend == "isal":
        pytest.importorskip("isal", reason="python-isal is not installed (pip install 'imgpipe[fast]')")
    block = "" if backend == "isal" else "sys.modules['isal'] = None; "
    check = f"from imgpipe.ingest import fastzlib; assert fastzlib.BACKEND == {backend!r}"
    code = f"import sys; {block}{check}; from imgpipe.cli import main; main()"

    def pack_with(src: Path, dst: Path) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", code, "pack", str(src), str(dst), "--shards", "train=3,val=2", "--workers", "2", "--no-progress"]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    for layout in ("hf-tar", "kaggle-zip"):
        result = pack_with(datasets / layout, tmp_path / layout)
        assert result.returncode == 0, result.stderr
        assert shard_files(tmp_path / layout) == shard_files(tree_pack)
    src = copy_layout(datasets, "hf-tar", tmp_path / "src")
    truncate(src / "data/train_images_2.tar.gz")
    assert_one_line_error(pack_with(src, tmp_path / "out"), "train_images_2.tar.gz", "truncated or corrupt .tar.gz", "download it again")


def test_missing_pyarrow_names_the_extra(datasets: Path, tmp_path: Path) -> None:
    code = "import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None; from imgpipe.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "pack", str(datasets / "hf-parquet"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(result, "pyarrow", "pip install 'imgpipe[parquet]'")


# ----------------------------------------------------------------------------- class names and synth


def test_classes_from_indices_are_ilsvrc2012_wnids_only_for_its_1000() -> None:
    wnids = ilsvrc2012_wnids()
    assert len(wnids) == 1000 and list(wnids) == sorted(wnids) and wnids[0] == "n01440764" and wnids[-1] == "n15075141"
    assert names_for_indices(range(1000)) == dict(enumerate(wnids))
    assert names_for_indices([0, 5, 3]) == {0: "0", 3: "3", 5: "5"}
    assert names_for_indices([3, 17, 999]) == {3: "003", 17: "017", 999: "999"}  # sorted names keep the numeric order
    assert names_for_indices(range(1001))[1000] == "1000"


def test_synth_layout_command_writes_once_and_lists_every_layout(tmp_path: Path) -> None:
    args = ("synth", tmp_path / "wds", "--layout", "wds", "--classes", "2", "--per-class", "2", "--val-per-class", "1",
            "--min-side", "16", "--max-side", "32")  # fmt: skip
    first = imgpipe(*args)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (tmp_path / "wds").iterdir()) == [
        ".imgpipe-synth.json",
        *(f"imagenet1k-train-{k:04d}.tar" for k in range(4)),
        "imagenet1k-validation-00.tar",
        "imagenet1k-validation-01.tar",
    ]
    marker = json.loads((tmp_path / "wds" / ".imgpipe-synth.json").read_text())
    assert marker["args"]["layout"] == "wds"
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "wds").iterdir()}
    again = imgpipe(*args)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "wds").iterdir()} == stamps
    helped = imgpipe("synth", "--help")
    assert all(layout in helped.stdout for layout in LAYOUTS)


def test_zip_members_named_outside_are_left_out_and_listed(datasets: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = copy_layout(datasets, "kaggle-zip", tmp_path / "src")
    archive = src / "imagenet-object-localization-challenge.zip"
    image = next((datasets / "tree" / "val").iterdir()).read_bytes()
    with zipfile.ZipFile(archive, "a") as z:
        z.writestr("ILSVRC/Data/CLS-LOC/val/../../../escaped.JPEG", image)
        z.writestr("ILSVRC/Data/CLS-LOC/val/.hidden.JPEG", image)
    with caplog.at_level(logging.WARNING):
        report = pack(src, tmp_path / "out", workers=1, progress=False)
    escaped = [s for s in report.skipped if "escaped" in s.path]
    assert [(s.split, s.path) for s in escaped] == [
        ("val", "imagenet-object-localization-challenge.zip/ILSVRC/Data/CLS-LOC/val/../../../escaped.JPEG")
    ]
    assert "climbs out" in escaped[0].reason and not [s for s in report.skipped if "hidden" in s.path]
    assert report.records == {"train": 38 - 3, "val": 12}
    assert f"{archive}: 'ILSVRC/Data/CLS-LOC/val/../../../escaped.JPEG' left out: member name is absolute or climbs out" in caplog.text


def add_members_named_outside(src: Path, layout: str) -> tuple[str, list[str]]:
    """Two more train images in the first archive of ``layout``, named ``../escaped...`` and ``/abs/absolute...``
    (the Parquet ``image.path``, the tar member, the WebDataset ``.json`` filename); the archive and the two names."""
    if layout == "hf-parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = src / "data" / "train-00000-of-00002.parquet"
        table = pq.read_table(path)
        image, label = table.column("image")[0].as_py(), table.column("label")[0].as_py()
        wnid = image["path"][-len("n00000000.JPEG") : -len(".JPEG")]
        names = [f"../escaped_{wnid}.JPEG", f"/abs/absolute_{wnid}.JPEG"]
        more = pa.table({"image": pa.array([{"bytes": image["bytes"], "path": n} for n in names], table.schema.field("image").type),
                         "label": pa.array([label, label], table.schema.field("label").type)})  # fmt: skip
        pq.write_table(pa.concat_tables([table, more]), path, row_group_size=10)
        return str(path), names
    if layout == "hf-tar":
        path = src / "data" / "train_images_0.tar.gz"
        with tarfile.open(path) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
        wnid = members[0][0].name[-len("n00000000.JPEG") : -len(".JPEG")]
        names = [f"../escaped_{wnid}.JPEG", f"/abs/absolute_{wnid}.JPEG"]
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for info, data in [*members, *((tarfile.TarInfo(n), members[0][1]) for n in names)]:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        path.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))
        return str(path), names
    path = src / "imagenet1k-train-0000.tar"
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    names = ["../escaped.JPEG", "/abs/absolute.JPEG"]
    buffer = io.BytesIO()
    extra = [(f"escape{k}.{suffix}", data) for k, n in enumerate(names)
             for suffix, data in (("jpg", members[0][1]), ("cls", b"0"), ("json", json.dumps({"filename": n}).encode()))]  # fmt: skip
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in [*members, *((tarfile.TarInfo(n), d) for n, d in extra)]:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return str(path), names


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", ["hf-parquet", "hf-tar", "wds"])
def test_a_member_named_outside_the_root_is_left_out_listed_and_warned(
    layout: str, datasets: Path, tree_pack: Path, tree_report: PackReport, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As for a zip or a tar: an absolute name or one climbing out with '..' is left out of the pack, which stays the
    tree's, listed as skipped, with one warning line naming the archive and the member."""
    src = copy_layout(datasets, layout, tmp_path / "src")
    archive, names = add_members_named_outside(src, layout)
    with caplog.at_level(logging.WARNING):
        report = pack(src, tmp_path / "out", shards="train=3,val=2", workers=2, progress=False)
    assert shard_files(tmp_path / "out") == shard_files(tree_pack) and report.records == tree_report.records
    shown = str(Path(archive).relative_to(src))
    outside = [(s.split, s.path, s.reason) for s in report.skipped if "escaped" in s.path or "absolute" in s.path]
    assert outside == [("train", f"{shown}/{name}", "member name is absolute or climbs out with '..'") for name in names]
    for name in names:
        assert f"{archive}: {name!r} left out: member name is absolute or climbs out with '..'" in caplog.text


def test_parquet_null_images_are_empty_and_hf_names_must_carry_the_wnid(datasets: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from imgpipe.ingest.parquet import image_bytes

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [
        {"bytes": b"abc", "path": "a_n00000001.JPEG"},
        None,
        {"bytes": None, "path": "c_n00000001.JPEG"},
        {"bytes": b"de", "path": "d_n00000001.JPEG"},
    ]
    column = pa.array(rows, type=image)
    starts, ends, data = image_bytes(column)
    assert [bytes(data[a:b]) for a, b in zip(starts, ends)] == [b"abc", b"", b"", b"de"]
    src = tmp_path / "parquet"
    (src / "data").mkdir(parents=True)
    photo = next((datasets / "tree" / "val").iterdir()).read_bytes()
    table = pa.table({"image": pa.array([{"bytes": photo, "path": "photo.JPEG"}, None], type=image), "label": [3, 3]})
    pq.write_table(table, src / "data" / "train-00000-of-00001.parquet")
    report = pack(src, tmp_path / "out", workers=1, progress=False)  # no wnid in the name: classes named by label
    assert load_manifest(tmp_path / "out").classes == ["3"] and report.records == {"train": 1}
    assert [s.reason for s in report.skipped] == ["empty file"]
    hf_tar = tmp_path / "hf"
    (hf_tar / "data").mkdir(parents=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("photo.JPEG")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    (hf_tar / "data" / "train_images_0.tar.gz").write_bytes(buffer.getvalue())
    assert_one_line_error(imgpipe("pack", hf_tar, tmp_path / "hf-out"), "train_images_0.tar.gz", "member photo.JPEG", "<image>_<wnid>.JPEG")


@pytest.mark.parametrize("layout", ARCHIVES)
def test_clean_jpegs_are_written_once_in_their_slots(layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record fills the slot laid out for it, so the slot files are the shards: no compaction copies them, from the
    tree or from any layout."""
    from imgpipe.packing import publish

    def no_copy(*args: object) -> None:
        raise AssertionError("a shard was compacted")

    monkeypatch.setattr(publish, "IndexedRecordWriter", no_copy)
    options = dict(classes=6, per_class=4, val_per_class=2, seed=2, min_side=32, max_side=64, progress=False)
    make_synthetic(tmp_path / "tree", **options)  # type: ignore[arg-type]
    make_synthetic(tmp_path / layout, layout=layout, **options)  # type: ignore[arg-type]
    pack(tmp_path / "tree", tmp_path / "from-tree", shards="train=3,val=2", workers=1, progress=False)
    pack(tmp_path / layout, tmp_path / "from-layout", shards="train=3,val=2", workers=2, progress=False)
    assert shard_files(tmp_path / "from-layout") == shard_files(tmp_path / "from-tree")
