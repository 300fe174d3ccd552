"""ImageNet-21k as people have it: winter21/fall11's folder of synset tars (and their outer tar) read in place, and
ImageNet-21K-P's imagenet21k_train/ and imagenet21k_val/ folders: each packs as the extracted class folders do."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from imgpipe.errors import DatasetError
from imgpipe.format.manifest import load_manifest
from imgpipe.ingest import members
from imgpipe.ingest.members import ArchiveFile, MemberSpans, member_reader
from imgpipe.ingest.scan import scan
from imgpipe.packing.packer import pack
from imgpipe.synth.tree import make_synthetic

SYNTH = dict(classes=5, per_class=6, val_per_class=2, seed=11, quirks=True, min_side=32, max_side=64, progress=False)
COMPARED = (".rec", ".idx", ".labels.npy", ".crc32.npy", ".index.npy")
OPTIONS = dict(shards="train=3", workers=2, progress=False)


def shard_files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name.endswith(COMPARED)}


def tar_of(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``classes/<wnid>/*`` (the extracted tree), ``winter21_whole/<wnid>.tar`` (its synset tars, members in a shuffled
    order as in the release) and ``fall11_whole.tar`` (the outer tar of those tars)."""
    base = tmp_path_factory.mktemp("in21k")
    make_synthetic(base / "synth", **SYNTH)
    shutil.move(base / "synth" / "train", base / "classes")
    (base / "winter21_whole").mkdir()
    rng = np.random.default_rng(0)
    for wnid in sorted(os.listdir(base / "classes")):
        files = sorted((base / "classes" / wnid).iterdir())
        tar_of(base / "winter21_whole" / f"{wnid}.tar", [(files[k].name, files[k].read_bytes()) for k in rng.permutation(len(files))])
    tars = sorted((base / "winter21_whole").iterdir())
    tar_of(base / "fall11_whole.tar", [(p.name, p.read_bytes()) for p in tars])
    return base


@pytest.fixture(scope="module")
def tree_pack(release: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("tree") / "out"
    pack(release / "classes", dst, **OPTIONS)
    return dst


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["winter21_whole", "fall11_whole.tar"])
def test_synset_tars_and_their_outer_tar_pack_as_the_extracted_class_folders(
    source: str, release: Path, tree_pack: Path, tmp_path: Path
) -> None:
    report = pack(release / source, tmp_path / "out", **OPTIONS)
    assert shard_files(tmp_path / "out") == shard_files(tree_pack)
    packed, tree = load_manifest(tmp_path / "out"), load_manifest(tree_pack)
    assert packed.layout == ("synset-tars" if source == "winter21_whole" else "tarballs") and tree.layout == "class-folders"
    assert packed.classes == tree.classes and len(packed.classes) == 5
    assert sorted(s.reason for s in report.skipped) == sorted(s.reason for s in tree.skipped) and report.skipped
    first = (tmp_path / "out" / "train.sources.txt").read_text().splitlines()[0]
    prefix = "" if source == "winter21_whole" else "fall11_whole.tar/"
    assert first.startswith(f"{prefix}n") and ".tar/" in first[len(prefix) :], first


def test_a_folder_of_synset_tars_and_class_folders_is_one_line(release: Path, tmp_path: Path) -> None:
    src = tmp_path / "half"
    shutil.copytree(release / "winter21_whole", src)
    (src / "n00000001").mkdir()  # tar xf of one synset tar into its own folder, as an extraction script does
    with pytest.raises(DatasetError, match=r"holds both synset tars \(n\d{8}\.tar\) and folders \(n00000001/\), a half-done extraction"):
        scan(src)
    with pytest.raises(DatasetError, match=r"split 'val' not found \(synset tars hold only train\)"):
        scan(release / "winter21_whole", ["val"])


@pytest.mark.timeout(120)
def test_imagenet21k_p_folders_pack_as_train_and_val_class_folders(release: Path, tmp_path: Path) -> None:
    """MIIL's layout: imagenet21k_train/<wnid>/, imagenet21k_val/<wnid>/ (and imagenet21k_small_classes/, not part of it)."""
    p21k, plain = tmp_path / "imagenet21k_resized", tmp_path / "plain"
    for root, train, val in ((p21k, "imagenet21k_train", "imagenet21k_val"), (plain, "train", "val")):
        shutil.copytree(release / "classes", root / train)
        for wnid in sorted(os.listdir(root / train)):
            (root / val / wnid).mkdir(parents=True)
            for image in sorted((root / train / wnid).iterdir())[:2]:  # the first images of each class, as MIIL's script moves them
                image.rename(root / val / wnid / image.name)
    shutil.copytree(release / "classes", p21k / "imagenet21k_small_classes")  # never read: its images would change every shard
    report = pack(p21k, tmp_path / "out", shards="train=3,val=2", workers=2, progress=False)
    reference = pack(plain, tmp_path / "ref", shards="train=3,val=2", workers=2, progress=False)
    assert shard_files(tmp_path / "out") == shard_files(tmp_path / "ref")
    assert report.records == reference.records and set(report.records) == {"train", "val"}
    manifest = load_manifest(tmp_path / "out")
    assert manifest.layout == "imagenet21k-p" and manifest.classes == load_manifest(tmp_path / "ref").classes
    sources = (tmp_path / "out" / "train.sources.txt").read_text() + (tmp_path / "out" / "val.sources.txt").read_text()
    assert "imagenet21k_small_classes" not in sources and "imagenet21k_val/" in sources


def test_a_shard_reading_from_many_archives_keeps_few_open(tmp_path: Path) -> None:
    archives = [ArchiveFile.of(tar_of(tmp_path / f"n{k:08d}.tar", [("a.JPEG", bytes([k]) * 10)])) for k in range(150)]
    spans = MemberSpans.concat([MemberSpans.of(archive, [512], [10]) for archive in archives])
    before = len(os.listdir("/proc/self/fd"))
    most = 0
    with member_reader(spans) as read:
        for k in [*range(150), *range(149, -1, -1)]:
            assert read(k, f"n{k:08d}.tar/a.JPEG") == bytes([k]) * 10
            most = max(most, len(os.listdir("/proc/self/fd")) - before)
    assert 0 < most <= members.MAX_OPEN_ARCHIVES + 1  # +1: the listing of /proc/self/fd itself
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_shards_spans_carry_only_the_archives_it_reads(tmp_path: Path) -> None:
    archives = [ArchiveFile.of(tar_of(tmp_path / f"n{k:08d}.tar", [("a.JPEG", bytes([k]) * 10)])) for k in range(40)]
    spans = MemberSpans.concat([MemberSpans.of(archive, [512], [10]) for archive in archives])
    order = np.array([33, 5, 17, 5 + 1, 39])
    shard = spans.take(order)
    assert shard.archives == tuple(archives[k] for k in sorted(order.tolist()))  # what a worker is sent: 5 tars, not 40
    with member_reader(shard) as read:
        assert [read(k, "x") for k in range(len(order))] == [bytes([k]) * 10 for k in order.tolist()]
    assert spans.take(slice(0, 40)).archives == spans.archives
