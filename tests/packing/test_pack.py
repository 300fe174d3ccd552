"""imgpipe.pack (the function) on real synthetic trees: skips and repairs, determinism, sharding, resume after kill -9, nodes."""

from __future__ import annotations

import errno
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _cli import kill_once_durable, slow_pack_command
from _fs import tmpfs
from _recordio_helpers import read_indexed
from PIL import Image

from imgpipe._sys.diskinfo import Mount, check_free_space, device_for_path, format_bytes, warn_if_slow
from imgpipe.errors import DatasetError, PackError
from imgpipe.format.manifest import MANIFEST_NAME, load_manifest
from imgpipe.format.unfinished import PLAN_NAME
from imgpipe.packing.journal import JOURNAL_DIR
from imgpipe.packing.packer import pack
from imgpipe.packing.plan import RECORD_OVERHEAD, parse_shard_counts, parse_size
from imgpipe.packing.progress import ProgressFile
from imgpipe.synth.tree import make_synthetic


@pytest.fixture(scope="module")
def quirk_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("quirks") / "src"
    make_synthetic(root, classes=3, per_class=6, val_per_class=2, seed=1, quirks=True, min_side=48, max_side=96, progress=False)
    return root


def output_files(dst: Path) -> dict[str, bytes]:
    """Every file of a packed folder except the pack journal, by name."""
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.is_file()}


def records(dst: Path, split: str) -> list[tuple[int, float, bytes]]:
    manifest = load_manifest(dst)
    out = []
    for shard in manifest.splits[split].shards:
        out += [(key, header.label, payload) for key, header, payload in read_indexed(dst / shard.name, dst / shard.index)]
    return out


def sources(dst: Path, split: str) -> list[str]:
    return (dst / f"{split}.sources.txt").read_text().splitlines()


@pytest.mark.timeout(60)
def test_quirks_are_skipped_or_repaired_and_clean_jpegs_kept_byte_exact(quirk_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    report = pack(quirk_tree, dst, shards="train=2,val=1", workers=1, progress=False)
    synth = make_synthetic(
        quirk_tree, classes=3, per_class=6, val_per_class=2, seed=1, quirks=True, min_side=48, max_side=96, progress=False
    )
    skipped = {s.path: s.reason for s in report.skipped}
    expected_skips = {synth.quirk_files[q] for q in ("truncated", "empty", "not_an_image")}
    assert set(skipped) == expected_skips
    assert all(reason for reason in skipped.values())
    assert report.actions.get("repaired") == 5
    manifest = load_manifest(dst)
    assert {s.path for s in manifest.skipped} == expected_skips
    assert manifest.classes == sorted(manifest.classes) and len(manifest.classes) == 3

    repaired = {synth.quirk_files[q] for q in ("cmyk", "grayscale", "grayscale_progressive", "png_named_jpeg", "exif_rotated")}
    train = records(dst, "train")
    paths = sources(dst, "train")
    labels = np.load(dst / "train.labels.npy")
    assert len(train) == len(paths) == len(labels) == 3 * 6 + 8 - 3
    keys = [key for key, _, _ in train]
    assert keys == sorted(keys) and len(set(keys)) == len(keys) and max(keys) == 3 * 6 + 8 - 1  # gaps where skipped
    for (_key, label, payload), path, sidecar_label in zip(train, paths, labels):
        assert int(label) == sidecar_label == manifest.classes.index(path.split("/")[1])
        image = Image.open(io.BytesIO(payload))
        assert image.format == "JPEG" and image.mode == "RGB"
        if path in repaired:
            assert payload != (quirk_tree / path).read_bytes()
        else:
            assert payload == (quirk_tree / path).read_bytes()
    assert len(records(dst, "val")) == 3 * 2


@pytest.mark.timeout(60)
def test_output_does_not_depend_on_workers(quirk_tree: Path, tmp_path: Path) -> None:
    one = pack(quirk_tree, tmp_path / "w1", shards=3, workers=1, progress=False)
    two = pack(quirk_tree, tmp_path / "w2", shards=3, workers=2, progress=False)
    assert one.shards_written == two.shards_written == 6
    first, second = output_files(tmp_path / "w1"), output_files(tmp_path / "w2")
    assert first.keys() == second.keys()
    for name in first:
        if name != "manifest.json":
            assert first[name] == second[name], name
    a, b = load_manifest(tmp_path / "w1"), load_manifest(tmp_path / "w2")
    assert a.splits == b.splits and a.options == b.options and a.skipped == b.skipped


def test_parse_size_and_shard_counts() -> None:
    assert parse_size("256MB") == 256 * 10**6
    assert parse_size("2MB") == 2 * 10**6
    assert parse_size("1GiB") == 2**30
    assert parse_size("1.5G") == 1_500_000_000
    assert parse_size("4096") == 4096
    for bad in ("", "MB", "12 parsecs", "-1MB", "0"):
        with pytest.raises(PackError, match="shard-size"):
            parse_size(bad)
    assert parse_shard_counts("8", ["train", "val"]) == {"train": 8, "val": 8}
    assert parse_shard_counts("train=1024,val=64", ["train", "val"]) == {"train": 1024, "val": 64}
    with pytest.raises(PackError, match="no count for split"):
        parse_shard_counts("train=4", ["train", "val"])
    with pytest.raises(PackError, match="at least 1"):
        parse_shard_counts("0", ["train"])


@pytest.mark.timeout(60)
def test_shard_count_from_shards_and_from_shard_size(synth_tree: Path, tmp_path: Path) -> None:
    pack(synth_tree, tmp_path / "n", shards="train=5,val=2", workers=1, progress=False)
    manifest = load_manifest(tmp_path / "n")
    assert [s.name for s in manifest.splits["train"].shards] == [f"train-{i:05d}-of-00005.rec" for i in range(5)]
    assert [s.records for s in manifest.splits["train"].shards] == [9, 10, 9, 10, 10]
    assert len(manifest.splits["val"].shards) == 2

    files = list((synth_tree / "train").rglob("*.JPEG"))
    estimate = sum(p.stat().st_size for p in files) + RECORD_OVERHEAD * len(files)
    pack(synth_tree, tmp_path / "s", shard_size="60KB", splits=["train"], workers=1, progress=False)
    shards = load_manifest(tmp_path / "s").splits["train"].shards
    assert len(shards) == -(-estimate // 60_000) > 1
    assert sum(s.bytes for s in shards) <= estimate

    pack(synth_tree, tmp_path / "many", shards=1000, splits=["val"], workers=1, progress=False)
    assert [s.records for s in load_manifest(tmp_path / "many").splits["val"].shards] == [1] * 12  # never an empty shard


@pytest.mark.timeout(60)
def test_seed_decides_the_order_and_no_shuffle_keeps_the_scan_order(synth_tree: Path, tmp_path: Path) -> None:
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        pack(synth_tree, tmp_path / name, shards=2, splits=["train"], seed=seed, workers=1, progress=False)
    assert output_files(tmp_path / "a") == output_files(tmp_path / "b")
    assert sources(tmp_path / "a", "train") != sources(tmp_path / "c", "train")
    assert sorted(sources(tmp_path / "a", "train")) == sorted(sources(tmp_path / "c", "train"))

    pack(synth_tree, tmp_path / "plain", shards=2, shuffle=False, workers=1, progress=False)
    plain = sources(tmp_path / "plain", "train")
    assert plain == sorted(plain)  # class folders then file names
    assert [key for key, _, _ in records(tmp_path / "plain", "train")] == list(range(len(plain)))
    val = sources(tmp_path / "plain", "val")
    assert val == sorted(val)


@pytest.mark.timeout(60)
def test_strict_refuses_skips_but_writes_a_usable_dataset(quirk_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(PackError, match=r"--strict: 3 source file\(s\) were skipped"):
        pack(quirk_tree, tmp_path / "out", shards=1, workers=1, strict=True, progress=False)
    assert load_manifest(tmp_path / "out").splits["train"].records == 3 * 6 + 5


@pytest.mark.timeout(60)
def test_rerun_with_other_options_is_refused_unless_overwrite(synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    pack(synth_tree, dst, shards=2, workers=1, progress=False)
    again = pack(synth_tree, dst, shards=2, workers=1, progress=False)
    assert again.shards_written == 0 and again.shards_reused == 4
    with pytest.raises(PackError, match=r"different options \(seed 0 -> 3\).*--overwrite"):
        pack(synth_tree, dst, shards=2, seed=3, workers=1, progress=False)
    pack(synth_tree, dst, shards=3, seed=3, overwrite=True, workers=1, progress=False)
    manifest = load_manifest(dst)
    assert manifest.options["seed"] == 3
    names = sorted(p.name for p in dst.glob("*.rec"))
    assert names == [f"train-{i:05d}-of-00003.rec" for i in range(3)] + [f"val-{i:05d}-of-00003.rec" for i in range(3)]

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "train-00000-of-00001.rec").write_bytes(b"x")
    with pytest.raises(PackError, match="unknown pack"):
        pack(synth_tree, foreign, workers=1, progress=False)


def inode_and_mtime(dst: Path, names: list[str]) -> dict[str, tuple[int, int]]:
    return {n: ((dst / n).stat().st_ino, (dst / n).stat().st_mtime_ns) for n in names}


@pytest.fixture(scope="module")
def kill_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kill") / "src"
    make_synthetic(root, classes=4, per_class=30, val_per_class=4, seed=2, quirks=True, min_side=120, max_side=200, progress=False)
    return root


@pytest.fixture(scope="module")
def resume_reference(kill_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("resume") / "reference"
    subprocess.run(slow_pack_command(kill_tree, dst), check=True, capture_output=True)
    return dst


def rerun_and_compare(src: Path, dst: Path, reference: Path) -> None:
    result = subprocess.run(slow_pack_command(src, dst), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert output_files(dst) == output_files(reference)
    assert not [p for p in dst.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_kill_after_first_shard_then_resume_is_byte_identical(kill_tree: Path, tmp_path: Path, resume_reference: Path) -> None:
    reference = resume_reference
    dst = tmp_path / "out"
    process = subprocess.Popen(slow_pack_command(kill_tree, dst), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = dst / JOURNAL_DIR
    deadline = time.monotonic() + 60
    while not [p for p in journal.glob("*-of-*.json")] and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = [p.name[: -len(".json")] for p in journal.glob("*-of-*.json")]
    assert finished and not (dst / "manifest.json").exists()
    kept = inode_and_mtime(dst, [f"{n}.{ext}" for n in finished for ext in ("rec", "idx")])
    rerun_and_compare(kill_tree, dst, reference)
    assert inode_and_mtime(dst, list(kept)) == kept  # finished shards were not rewritten


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("moments", ["planned, then 1 shard", "half the shards, then all but 1"])
def test_killed_twice_at_set_moments_then_resumed_is_byte_identical(
    kill_tree: Path, tmp_path: Path, resume_reference: Path, moments: str
) -> None:
    """kill -9 once the plan is written (no shard yet) or half the shards are durable, again in the resumed run one shard
    later or one shard before the end, then a rerun: the output is the uninterrupted pack's. The moments are counted in
    durable shards, checked while the pack is stopped, so what each run covers is the same on any machine under any load."""
    total = len(list(resume_reference.glob("*.rec")))
    first, second = (0, 1) if moments.startswith("planned") else (total // 2, total - 1)
    dst = tmp_path / "out"
    journal = dst / JOURNAL_DIR
    durable = lambda: len(list(journal.glob("*-of-*.json")))  # noqa: E731
    kill_once_durable(slow_pack_command(kill_tree, dst), lambda: (journal / PLAN_NAME).exists() and durable() >= first)
    assert first <= durable() < total and not (dst / "manifest.json").exists()
    kill_once_durable(slow_pack_command(kill_tree, dst), lambda: durable() >= second)
    assert second <= durable() and not (dst / "manifest.json").exists()
    rerun_and_compare(kill_tree, dst, resume_reference)


@pytest.mark.timeout(90)
def test_two_nodes_then_finalize_equal_one_node(synth_tree: Path, tmp_path: Path) -> None:
    single = tmp_path / "single"
    pack(synth_tree, single, shards="train=3,val=2", workers=1, progress=False)
    multi = tmp_path / "multi"
    options = dict(shards="train=3,val=2", workers=1, progress=False, num_nodes=2)
    first = pack(synth_tree, multi, node_rank=1, **options)
    assert first.manifest is None and first.shards_written == 2 and len(first.shards_pending) == 3
    with pytest.raises(PackError, match=r"3 shard\(s\) are not written yet"):
        pack(synth_tree, multi, finalize=True, **options)
    second = pack(synth_tree, multi, node_rank=0, **options)
    assert second.shards_written == 3 and second.manifest is not None  # the last node finalizes by itself
    (multi / "manifest.json").unlink()
    final = pack(synth_tree, multi, finalize=True, **options)
    assert final.shards_written == 0 and final.manifest is not None
    assert output_files(multi) == output_files(single)


@pytest.mark.timeout(60)
def test_kaggle_layout_packs_like_the_imagenet_layout(synth_tree: Path, tmp_path: Path) -> None:
    kaggle = tmp_path / "kaggle"
    data = kaggle / "ILSVRC" / "Data" / "CLS-LOC"
    shutil.copytree(synth_tree / "train", data / "train")
    shutil.copytree(synth_tree / "val", data / "val")
    shutil.copy(synth_tree / "LOC_val_solution.csv", kaggle / "LOC_val_solution.csv")
    pack(kaggle, tmp_path / "k", shards=2, workers=1, progress=False)
    pack(synth_tree, tmp_path / "i", shards=2, workers=1, progress=False)
    k, i = load_manifest(tmp_path / "k"), load_manifest(tmp_path / "i")
    assert k.classes == i.classes
    assert [line.split("/", 3)[3] for line in sources(tmp_path / "k", "val")] == sources(tmp_path / "i", "val")
    for split in ("train", "val"):
        for shard in k.splits[split].shards:
            assert (tmp_path / "k" / shard.name).read_bytes() == (tmp_path / "i" / shard.name).read_bytes()


@pytest.mark.timeout(60)
def test_resize_shrinks_the_shorter_side_and_never_upscales(quirk_tree: Path, tmp_path: Path) -> None:
    pack(quirk_tree, tmp_path / "r", resize=56, shards=1, splits=["train"], workers=1, progress=False)
    for (_, _, payload), path in zip(records(tmp_path / "r", "train"), sources(tmp_path / "r", "train")):
        image = Image.open(io.BytesIO(payload))
        assert image.format == "JPEG"
        try:
            original = min(Image.open(quirk_tree / path).size)
        except OSError:
            continue
        assert min(image.size) == min(original, 56), path


@pytest.mark.timeout(60)
def test_free_space_is_checked_before_writing(synth_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(PackError, match=r"needs about 1000000.0 TB but only \d+\.\d [KMGT]B is free there"):
        check_free_space(tmp_path, 10**18)
    check_free_space(tmp_path, 1)
    with tmpfs(tmp_path / "small", "64k") as small:
        assert device_for_path(small).fstype == "tmpfs"
        with pytest.raises(PackError, match=r"needs about \d+\.\d KB but only \d+\.\d KB is free"):  # not "0.00 GB ... 0.00 GB"
            pack(synth_tree, small / "out", workers=1, progress=False)
        assert not list((small / "out").glob("*.rec"))


def test_device_for_path_finds_the_deepest_mount_holding_the_path(tmp_path: Path) -> None:
    mounted = [Mount("/dev/sda1", "/", "ext4"), Mount("server:/export", "/data", "nfs4"), Mount("/dev/nvme0n1p2", "/data/local ssd", "xfs")]
    assert device_for_path("/data/imagenet/x", mounted=mounted).network is True
    local = device_for_path("/data/local ssd/imagenet", mounted=mounted)
    assert (local.mountpoint, local.fstype, local.network) == ("/data/local ssd", "xfs", False)
    assert device_for_path("/home/me", mounted=mounted).mountpoint == "/"
    real = device_for_path(tmp_path / "data")  # nearest existing parent, on this machine's real mounts
    assert real.mountpoint and str(tmp_path).startswith(real.mountpoint)
    with tmpfs(tmp_path / "a mount\twith spaces", "64k") as spaced:  # /proc/self/mounts escapes these as \040 and \011
        inside = device_for_path(spaced / "imagenet" / "x")
        assert (inside.mountpoint, inside.fstype, inside.network) == (str(spaced), "tmpfs", False)


@pytest.mark.timeout(60)
def test_a_full_disk_at_a_checkpoint_of_an_inline_pack_names_dst_not_the_read(
    synth_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one worker the reading runs in the parent, under the job's name; a checkpoint's ENOSPC is DST's."""

    def disk_full(self: ProgressFile, finished: np.ndarray) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    monkeypatch.setattr(ProgressFile, "save", disk_full)
    with pytest.raises(PackError, match=r"^DST .*: writing shards failed: No space left on device \(ENOSPC\)") as raised:
        pack(synth_tree, tmp_path / "out", shards=2, workers=1, checkpoint_s=0, progress=False)
    assert "reading" not in str(raised.value) and "rerun the same command to resume" in str(raised.value)


@pytest.mark.timeout(60)
def test_a_failing_worker_stops_the_pack_with_the_shard_named(synth_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    pack(synth_tree, dst, shards=2, workers=2, progress=False)
    (dst / JOURNAL_DIR / "train-00001-of-00002.json").unlink()
    (dst / "train-00001-of-00002.rec").unlink()
    (dst / "train-00001-of-00002.rec").mkdir()  # the rename of the new shard onto it fails in the worker
    (dst / "train-00001-of-00002.rec" / "x").write_bytes(b"")
    (dst / JOURNAL_DIR / "val-00000-of-00002.json").unlink()
    with pytest.raises(PackError, match=r"writing shard train-00001-of-00002 failed: IsADirectoryError"):
        pack(synth_tree, dst, shards=2, workers=2, progress=False)
    assert not [p for p in dst.iterdir() if p.name.endswith(".tmp")]


def test_user_errors_are_one_line_imgpipe_errors(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="no such folder"):
        pack(tmp_path / "missing", tmp_path / "out", progress=False)
    (tmp_path / "empty" / "n01").mkdir(parents=True)
    with pytest.raises(PackError, match="no images found"):
        pack(tmp_path / "empty", tmp_path / "out", progress=False)
    with pytest.raises(DatasetError):
        pack(tmp_path / "empty", tmp_path / "out", splits=["val"], progress=False)
    with pytest.raises(PackError, match="inside SRC"):
        pack(tmp_path / "empty", tmp_path / "empty" / "out", progress=False)
    with pytest.raises(PackError, match="--overwrite with --num-nodes"):
        pack(tmp_path / "empty", tmp_path / "out", overwrite=True, num_nodes=2, progress=False)
    for every in (-1.0, float("nan"), float("inf")):
        with pytest.raises(PackError, match="--checkpoint-every"):
            pack(tmp_path / "empty", tmp_path / "out", checkpoint_s=every, progress=False)


def _odd_name_tree(synth_tree: Path, root: Path) -> Path:
    """Class folders holding names with a space, unicode, a tab, \\r, \\x85, U+2028 and a newline."""
    jpegs = sorted((synth_tree / "train").rglob("*.JPEG"))
    names = ["with space.JPEG", "naïve 图.jpg", "a\tb.jpg", "cr\rname.jpg", "nel\x85x\u2028y.jpg", "new\nline.jpg"]
    for k, name in enumerate(names):
        folder = root / ("cls a" if k % 2 else "ünï")
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(jpegs[k], folder / name)
    return root


def test_odd_file_names_pack_and_a_newline_is_skipped_with_a_reason(synth_tree: Path, tmp_path: Path) -> None:
    from imgpipe.format.verify import verify

    src = _odd_name_tree(synth_tree, tmp_path / "src")
    report = pack(src, tmp_path / "out", workers=1, progress=False)
    assert report.records == {"train": 5}
    assert [(s.split, s.path) for s in report.skipped] == [("train", "cls a/new\nline.jpg")]
    assert "newline" in report.skipped[0].reason and "cls a/new\\nline.jpg" in report.summary()
    assert load_manifest(tmp_path / "out").skipped == report.skipped
    sources = (tmp_path / "out" / "train.sources.txt").read_bytes().decode("utf-8").split("\n")
    assert sources[-1] == "" and len(sources) == 6 and "ünï/nel\x85x\u2028y.jpg" in sources
    assert verify(tmp_path / "out", progress=False).ok
    with pytest.raises(PackError, match="--strict: 1 source file"):
        pack(src, tmp_path / "out", workers=1, progress=False, strict=True)


def test_bad_destinations_are_refused_with_one_line(synth_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for dst in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        with pytest.raises(PackError, match="is a file, not a folder"):
            pack(synth_tree, dst, progress=False)
    with pytest.raises(PackError, match="is a file, not a folder"):
        pack(tmp_path / "afile", tmp_path / "out", progress=False)
    (tmp_path / "link").symlink_to(synth_tree / "train")
    with pytest.raises(PackError, match="inside SRC"):
        pack(synth_tree, tmp_path / "link" / "out", progress=False)
    with pytest.raises(PackError, match="--num-nodes 0: need at least 1"):
        pack(synth_tree, tmp_path / "out", num_nodes=0, progress=False)
    assert not (tmp_path / "out").exists() and not list((synth_tree / "train").glob("out*"))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can write into a read-only folder")
def test_a_read_only_dst_is_refused_with_one_line(synth_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir(mode=0o555)
    for dst in (tmp_path / "ro", tmp_path / "ro" / "sub"):
        with pytest.raises(PackError, match="cannot write there"):
            pack(synth_tree, dst, progress=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("resize", [None, 32])
def test_an_image_over_the_decoders_pixel_limit_is_skipped_in_both_modes(
    tmp_path: Path, resize: int | None, monkeypatch: pytest.MonkeyPatch, scan_check: str
) -> None:
    """Pillow's decompression-bomb limit, lowered so that a 300x200 image stands for a 15000x15000 one."""
    src = tmp_path / "src"
    (src / "A").mkdir(parents=True)
    Image.new("RGB", (60, 40), (200, 10, 10)).save(src / "A" / "small.jpg", quality=90)
    Image.new("RGB", (300, 200), (10, 200, 10)).save(src / "A" / "huge.jpg", quality=90)  # clean YCbCr: kept byte for byte before
    Image.new("RGB", (300, 200), (10, 10, 200)).save(src / "A" / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20_000)  # Pillow refuses above 2 x 20,000 = 40,000 pixels
    report = pack(src, tmp_path / "dst", resize=resize, workers=1, progress=False)
    skipped = {s.path: s.reason for s in report.skipped}
    assert skipped["A/huge.jpg"] == "image too large to decode safely (300x200 = 60,000 pixels, over Pillow's limit of 40,000)"
    assert skipped["A/huge.png"].startswith("image too large to decode safely")
    assert report.records == {"train": 1}
    from imgpipe.format.verify import verify

    assert verify(tmp_path / "dst", decode=True, workers=1, progress=False).ok


def test_format_bytes_picks_the_unit_that_fits() -> None:
    assert [format_bytes(n) for n in (0, 999, 12_345, 8_000_000, 12_345_678_901, 3 * 10**15)] == [
        "0 B",
        "999 B",
        "12.3 KB",
        "8.0 MB",
        "12.3 GB",
        "3000.0 TB",
    ]


def test_warn_if_slow_names_a_network_or_rotational_dst(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Through the seam device_for_path already has: a mounts table and a /sys/block of our own."""
    sys_block = tmp_path / "sys-block"
    (sys_block / "hdz" / "queue").mkdir(parents=True)
    (sys_block / "hdz" / "queue" / "rotational").write_text("1\n")
    (sys_block / "ssz" / "queue").mkdir(parents=True)
    (sys_block / "ssz" / "queue" / "rotational").write_text("0\n")
    mounted = [Mount("/dev/root", "/", "ext4"), Mount("server:/export", "/nfs", "nfs4"), Mount("/dev/hdz", "/spin", "xfs")]
    seam = dict(mounted=[*mounted, Mount("/dev/ssz", "/fast", "xfs")], sys_block=sys_block)
    with caplog.at_level("WARNING", logger="imgpipe._sys.diskinfo"):
        assert warn_if_slow("/nfs/imagenet", **seam).network
        assert warn_if_slow("/spin/imagenet", **seam).rotational
        assert warn_if_slow("/fast/imagenet", **seam).slow is False
    assert [r.getMessage() for r in caplog.records] == [
        "DST /nfs/imagenet is on a network filesystem (nfs4 at /nfs): reads and writes will be slow; use a local SSD if you can",
        "DST /spin/imagenet is on a rotational disk (/dev/hdz): random reads will be slow; use an SSD if you can",
    ]


def _jpeg_with_a_broken_scan() -> bytes:
    """A JPEG whose headers and EOI are intact but whose entropy-coded data Pillow cannot decode."""
    import zlib

    rng = np.random.default_rng(0)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)).save(out, "JPEG", quality=90)
    clean = out.getvalue()
    for seed in range(1000):
        data = bytearray(clean)
        start = len(data) // 2 + seed % 97
        data[start : start + 40] = zlib.crc32(bytes([seed])).to_bytes(4, "little") * 10
        data = bytes(data)
        try:
            Image.open(io.BytesIO(data)).load()
        except OSError:
            return data
    raise AssertionError("no corruption that Pillow refuses")


@pytest.mark.timeout(60)
def test_a_clean_header_over_a_broken_scan_is_skipped_so_verify_decode_passes(tmp_path: Path, scan_check: str) -> None:
    src = tmp_path / "src"
    (src / "A").mkdir(parents=True)
    Image.new("RGB", (60, 40), (200, 10, 10)).save(src / "A" / "good.jpg", quality=90)
    (src / "A" / "broken.jpg").write_bytes(_jpeg_with_a_broken_scan())
    report = pack(src, tmp_path / "dst", workers=1, progress=False)
    assert [s.path for s in report.skipped] == ["A/broken.jpg"]
    assert report.skipped[0].reason.startswith("cannot decode (OSError: ")
    result = subprocess.run([sys.executable, "-m", "imgpipe", "verify", str(tmp_path / "dst"), "--decode"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_an_image_too_large_for_a_record_is_skipped_with_the_reason_and_the_pack_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RecordIO's length field holds less than 2**29 bytes: a larger image is left out with the reason (it stopped the
    pack with a ValueError). The limit is lowered here (the workers are forked, so they inherit it)."""
    from imgpipe.format.verify import verify
    from imgpipe.packing import scatter

    src = tmp_path / "src"
    make_synthetic(src, classes=2, per_class=4, val_per_class=0, min_side=32, max_side=48, progress=False)
    big = src / "train" / sorted(p.name for p in (src / "train").iterdir())[0] / "big.JPEG"
    Image.effect_noise((400, 400), 80).convert("RGB").save(big, quality=95)
    monkeypatch.setattr(scatter, "MAX_RECORD_BYTES", big.stat().st_size)
    report = pack(src, tmp_path / "dst", workers=2, progress=False)
    assert [(s.path.rsplit("/", 1)[-1], s.reason) for s in report.skipped] == [("big.JPEG", scatter.TOO_LARGE_REASON)]
    assert verify(tmp_path / "dst").ok


@pytest.mark.timeout(60)
def test_a_rerun_of_a_finished_pack_reads_no_shard_again(synth_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shards were checked before the manifest was first written: a rerun (scripts rerun a pack) checks their sizes
    and ends, not after hashing every shard again (140 GB for ImageNet); a resumed pack still hashes what others wrote."""
    from imgpipe.packing import finalize

    dst = tmp_path / "out"
    pack(synth_tree, dst, shards=2, workers=1, progress=False)
    hashed: list[str] = []
    sha256_file = finalize.sha256_file
    monkeypatch.setattr(finalize, "sha256_file", lambda path: hashed.append(Path(path).name) or sha256_file(path))
    again = pack(synth_tree, dst, shards=2, workers=1, progress=False)
    assert (again.shards_written, again.shards_reused, hashed) == (0, 4, [])
    (dst / MANIFEST_NAME).unlink()  # as a pack killed before its manifest: the shards of that run are checked in full
    resumed = pack(synth_tree, dst, shards=2, workers=1, progress=False)
    assert resumed.shards_written == 0 and len(hashed) == 8 and (dst / MANIFEST_NAME).is_file()
