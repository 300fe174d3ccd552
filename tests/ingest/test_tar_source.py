"""Packing image-net.org's tarballs in place: identical shards to the extracted tree, devkit labels,
broken downloads, resume after kill -9, and the node rank from SLURM's variables."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from _cli import assert_one_line_error, slow_pack_command
from _fs import as_plain_user

from imgpipe.cli.data import node_identity
from imgpipe.format.manifest import load_manifest
from imgpipe.ingest.devkit import DEVKIT_NAME, GROUND_TRUTH, META, read_devkit
from imgpipe.ingest.imagenet_tars import TRAIN_TAR, VAL_TAR
from imgpipe.packing.journal import JOURNAL_DIR
from imgpipe.packing.packer import pack
from imgpipe.synth.tree import make_synthetic

SYNTH = dict(classes=4, per_class=10, val_per_class=3, seed=3, quirks=True, min_side=48, max_side=96, progress=False)


def imgpipe(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "imgpipe", *map(str, args)], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def output_files(dst: Path, leave_out: tuple[str, ...] = ()) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.is_file() and p.name not in leave_out}


def as_tree_path(source: str) -> str:
    """The extracted-tree path of a tar member's source path."""
    if source.startswith(TRAIN_TAR + "/"):
        wnid_tar, _, name = source[len(TRAIN_TAR) + 1 :].partition("/")
        return f"train/{wnid_tar[: -len('.tar')]}/{name}"
    assert source.startswith(VAL_TAR + "/"), source
    return "val/" + source[len(VAL_TAR) + 1 :]


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same synthetic dataset twice: as an extracted tree and as image-net.org's three files."""
    base = tmp_path_factory.mktemp("twins")
    make_synthetic(base / "tree", **SYNTH)
    make_synthetic(base / "tars", tars=True, **SYNTH)
    return base / "tree", base / "tars"


@pytest.mark.timeout(120)
def test_tars_pack_byte_identical_to_extracted_tree_and_verify(twins: tuple[Path, Path], tmp_path: Path) -> None:
    tree, tars = twins
    assert sorted(p.name for p in tars.iterdir() if not p.name.startswith(".")) == sorted([TRAIN_TAR, VAL_TAR, DEVKIT_NAME])
    options = dict(shards="train=3,val=2", workers=2, progress=False)
    from_tree = pack(tree, tmp_path / "tree", **options)
    from_tars = pack(tars, tmp_path / "tars", **options)
    sidecars = ("manifest.json", "train.sources.txt", "val.sources.txt")
    assert output_files(tmp_path / "tars", sidecars) == output_files(tmp_path / "tree", sidecars)
    assert len(output_files(tmp_path / "tree", sidecars)) == 2 * 5 + 6  # .rec/.idx of 5 shards, labels, crc32 and index of 2 splits
    a, b = load_manifest(tmp_path / "tree"), load_manifest(tmp_path / "tars")
    assert a.classes == b.classes and a.options == b.options and b.source == str(tars)
    assert {s: [x.sha256 for x in a.splits[s].shards] for s in a.splits} == {s: [x.sha256 for x in b.splits[s].shards] for s in b.splits}
    for split in ("train", "val"):
        tar_sources = (tmp_path / "tars" / f"{split}.sources.txt").read_text().splitlines()
        assert [as_tree_path(s) for s in tar_sources] == (tmp_path / "tree" / f"{split}.sources.txt").read_text().splitlines()
    assert from_tars.skipped and [as_tree_path(s.path) for s in from_tars.skipped] == [s.path for s in from_tree.skipped]
    assert {s.reason for s in from_tars.skipped} == {"empty file", "truncated JPEG (no EOI marker)", "not an image"}

    verified = imgpipe("verify", tmp_path / "tars", "--decode", "--workers", "2")
    assert verified.returncode == 0 and ": OK: checked and decoded" in verified.stdout, verified.stdout + verified.stderr
    info = imgpipe("info", tmp_path / "tars")
    assert info.returncode == 0 and f"{TRAIN_TAR}/" in info.stdout, info.stderr


def test_devkit_ids_in_shuffled_order_give_sorted_wnid_classes(
    twins: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree, tars = twins
    from scipy.io import loadmat

    with tarfile.open(tars / DEVKIT_NAME) as archive:
        meta = archive.extractfile(f"ILSVRC2012_devkit_t12/{META}").read()  # type: ignore[union-attr]
    synsets = loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
    children = [int(n) for n in synsets["num_children"]]
    leaf_wnids_by_id = [w for _, w, n in sorted(zip(synsets["ILSVRC2012_ID"], synsets["WNID"], children)) if n == 0]
    assert any(n > 0 for n in children)  # parent synsets a reader must leave out
    assert leaf_wnids_by_id != sorted(leaf_wnids_by_id)  # the devkit's ID order is not sorted-wnid order

    devkit = read_devkit(tars / DEVKIT_NAME)
    classes = sorted(p.name for p in (tree / "train").iterdir())
    assert devkit.wnids == classes
    csv = {line.split(",")[0]: line.split(",")[1].split()[0] for line in (tree / "LOC_val_solution.csv").read_text().splitlines()[1:]}
    assert len(devkit.ground_truth) == len(csv) == 12
    assert {name: devkit.val_wnid(name + ".JPEG") for name in csv} == csv

    # torchvision's own devkit parser reads the synthetic devkit the same way (its md5 check is for the real file)
    from torchvision.datasets import imagenet

    monkeypatch.setattr(imagenet, "_verify_archive", lambda *args: None)
    shutil.copy(tars / DEVKIT_NAME, tmp_path)
    imagenet.parse_devkit_archive(str(tmp_path))
    wnid_to_classes, val_wnids = imagenet.load_meta_file(str(tmp_path))
    assert sorted(wnid_to_classes) == classes
    assert val_wnids == [devkit.val_wnid(f"ILSVRC2012_val_{k:08d}.JPEG") for k in range(1, len(csv) + 1)]


@pytest.mark.timeout(120)
def test_val_tar_with_csv_and_files_named_one_by_one(twins: tuple[Path, Path], tmp_path: Path) -> None:
    tree, tars = twins
    reference = tmp_path / "reference"
    pack(tree, reference, shards=2, workers=1, progress=False)
    csv_only = tmp_path / "csv-only"
    csv_only.mkdir()
    for name in (TRAIN_TAR, VAL_TAR):
        os.link(tars / name, csv_only / name)
    shutil.copy(tree / "LOC_val_solution.csv", csv_only)
    sidecars = ("manifest.json", "train.sources.txt", "val.sources.txt")
    pack(csv_only, tmp_path / "csv", shards=2, workers=1, progress=False)
    assert output_files(tmp_path / "csv", sidecars) == output_files(reference, sidecars)

    named = imgpipe("pack", tars / TRAIN_TAR, tars / VAL_TAR, tars / DEVKIT_NAME, tmp_path / "named", "--shards", "2", "--workers", "1")
    assert named.returncode == 0, named.stderr
    assert output_files(tmp_path / "named", sidecars) == output_files(reference, sidecars)
    val_only = imgpipe("pack", tars / VAL_TAR, tmp_path / "val-only", "--shards", "2", "--workers", "1")  # the devkit lies beside it
    assert val_only.returncode == 0, val_only.stderr
    pack(
        tree, tmp_path / "tree-val-only", splits=["val"], shards=2, workers=1, progress=False
    )  # the shuffle seed depends on the split's index
    assert output_files(tmp_path / "val-only", sidecars) == output_files(tmp_path / "tree-val-only", sidecars)


def copy_with(tars: Path, folder: Path, **replaced: bytes) -> Path:
    """A copy of the tarball folder, with some files' bytes replaced (or left out when empty)."""
    folder.mkdir()
    for name in (TRAIN_TAR, VAL_TAR, DEVKIT_NAME):
        data = replaced.get(name)
        if data is None:
            os.link(tars / name, folder / name)
        elif data:
            (folder / name).write_bytes(data)
    return folder


def with_truncated_class_tar(train_tar: bytes, which: int, keep: int) -> tuple[bytes, str]:
    """The train tar rebuilt with class tar ``which`` cut to ``keep`` bytes (the outer tar stays intact)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(train_tar)) as source, tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as target:
        for k, member in enumerate(source.getmembers()):
            data = source.extractfile(member).read()  # type: ignore[union-attr]
            if k == which:
                data, name = data[:keep], member.name
            member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    return out.getvalue(), name


@pytest.mark.timeout(120)
def test_broken_downloads_get_one_line_each(twins: tuple[Path, Path], tmp_path: Path) -> None:
    _, tars = twins
    train = (tars / TRAIN_TAR).read_bytes()
    with tarfile.open(tars / TRAIN_TAR) as archive:
        first = archive.getmembers()[0]
    cases = {
        "mid-member": (
            dict(ILSVRC2012_img_train_tar=train[: len(train) // 2]),
            [str(TRAIN_TAR), "truncated or corrupt tar", "ends inside member"],
        ),
        # cut right after a member's data: tarfile alone would call this a complete, shorter tar
        "at-header": (
            dict(ILSVRC2012_img_train_tar=train[: first.offset_data + (first.size + 511) // 512 * 512]),
            [TRAIN_TAR, f"ends after member {first.name} without the end-of-archive block"],
        ),
        "val-tar": (dict(ILSVRC2012_img_val_tar=(tars / VAL_TAR).read_bytes()[:3000]), [VAL_TAR, "truncated or corrupt tar"]),
        "devkit-gone": (dict(ILSVRC2012_devkit_t12_tar_gz=b""), [VAL_TAR, "no val labels", DEVKIT_NAME, "--splits train"]),
        "devkit-cut": (
            dict(ILSVRC2012_devkit_t12_tar_gz=(tars / DEVKIT_NAME).read_bytes()[:300]),
            [DEVKIT_NAME, "unreadable devkit archive"],
        ),
    }
    class_tar, name = with_truncated_class_tar(train, which=2, keep=3000)
    cases["class-tar"] = (
        dict(ILSVRC2012_img_train_tar=class_tar),
        [f"{TRAIN_TAR}/{name}: truncated or corrupt tar", f"download {TRAIN_TAR} again"],
    )
    broken_meta = io.BytesIO()
    with tarfile.open(fileobj=broken_meta, mode="w:gz") as archive:
        for member, data in ((META, b"MATLAB 5.0 MAT-file, but not really" * 8), (GROUND_TRUTH, b"1\n")):
            info = tarfile.TarInfo(f"ILSVRC2012_devkit_t12/{member}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    cases["meta.mat"] = (dict(ILSVRC2012_devkit_t12_tar_gz=broken_meta.getvalue()), [DEVKIT_NAME, f"{META}: unreadable"])
    for case, (replaced, fragments) in cases.items():
        files = {k.replace("_tar_gz", ".tar.gz").replace("_tar", ".tar"): v for k, v in replaced.items()}
        src = copy_with(tars, tmp_path / case, **files)
        result = imgpipe("pack", src, tmp_path / f"{case}-out", "--workers", "2", "--no-progress")
        assert_one_line_error(result, *fragments)


def test_missing_scipy_names_the_extra(twins: tuple[Path, Path], tmp_path: Path) -> None:
    _, tars = twins
    code = "import sys; sys.modules['scipy'] = None; from imgpipe.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "pack", str(tars), str(tmp_path / "out")], capture_output=True, text=True, timeout=120
    )
    assert_one_line_error(result, META, "pip install 'imgpipe[devkit]'")


@pytest.mark.timeout(120)
def test_broken_download_keeps_finished_shards_and_resumes_after_redownload(twins: tuple[Path, Path], tmp_path: Path) -> None:
    _, tars = twins
    src = copy_with(tars, tmp_path / "src")
    dst = tmp_path / "out"
    args = ("--shards", "train=3,val=2", "--workers", "1", "--num-nodes", "2", "--no-progress")
    assert imgpipe("pack", src, dst, *args, "--node-rank", "0").returncode == 0
    journaled = sorted(p.name for p in (dst / JOURNAL_DIR).glob("*-of-*.json"))
    assert len(journaled) == 3
    good = (src / TRAIN_TAR).read_bytes()
    (src / TRAIN_TAR).unlink()
    (src / TRAIN_TAR).write_bytes(good[: len(good) // 2])
    assert_one_line_error(imgpipe("pack", src, dst, *args, "--node-rank", "1"), TRAIN_TAR, "download")
    assert sorted(p.name for p in (dst / JOURNAL_DIR).glob("*-of-*.json")) == journaled
    (src / TRAIN_TAR).write_bytes(good)  # downloaded again
    resumed = imgpipe("pack", src, dst, *args, "--node-rank", "1")
    assert resumed.returncode == 0 and "packed 57 records" in resumed.stdout, resumed.stdout + resumed.stderr
    single = pack(tars, tmp_path / "single", shards="train=3,val=2", workers=1, progress=False)
    assert output_files(dst, ("manifest.json",)) == output_files(tmp_path / "single", ("manifest.json",))
    assert single.manifest is not None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_then_resume_from_tars_is_byte_identical(tmp_path: Path) -> None:
    options = dict(classes=4, per_class=25, val_per_class=4, seed=2, quirks=True, min_side=120, max_side=200, progress=False)
    make_synthetic(tmp_path / "tars", tars=True, **options)
    reference = tmp_path / "reference"
    subprocess.run(slow_pack_command(tmp_path / "tars", reference), check=True, capture_output=True, timeout=120)
    dst = tmp_path / "out"
    process = subprocess.Popen(slow_pack_command(tmp_path / "tars", dst), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list((dst / JOURNAL_DIR).glob("*-of-*.json")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert list((dst / JOURNAL_DIR).glob("*-of-*.json")) and not (dst / "manifest.json").exists()
    result = subprocess.run(slow_pack_command(tmp_path / "tars", dst), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert output_files(dst) == output_files(reference)
    assert not [p for p in dst.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.timeout(120)
def test_slurm_variables_pick_the_node_rank(twins: tuple[Path, Path], tmp_path: Path) -> None:
    _, tars = twins
    single = tmp_path / "single"
    assert imgpipe("pack", tars, single, "--shards", "train=3,val=2", "--workers", "1").returncode == 0
    multi = tmp_path / "multi"
    runs = {}
    for rank in (1, 0):
        runs[rank] = imgpipe("pack", tars, multi, "--shards", "train=3,val=2", "--workers", "1",
                             env={"SLURM_NNODES": "2", "SLURM_NODEID": str(rank)})  # fmt: skip
        assert runs[rank].returncode == 0, runs[rank].stderr
        assert f"node {rank} of 2, from SLURM_NNODES and SLURM_NODEID" in runs[rank].stderr
    assert "wrote 2 shard(s)" in runs[1].stdout and "3 still to be written by other nodes" in runs[1].stdout
    (multi / "manifest.json").unlink()
    finalized = imgpipe("pack", tars, multi, "--shards", "train=3,val=2", "--workers", "1", "--finalize")
    assert finalized.returncode == 0 and "shards: 0 written, 0 already done, 5 in the plan" in finalized.stdout, finalized.stderr
    assert output_files(multi) == output_files(single)


def test_node_identity_arguments_win_over_slurm() -> None:
    slurm = {"SLURM_NNODES": "4", "SLURM_NODEID": "3"}
    assert node_identity(None, None, slurm) == (4, 3, None)
    assert node_identity(None, None, {}) == (1, 0, None)
    assert node_identity(2, 1, slurm) == (2, 1, None)
    assert node_identity(None, 0, slurm) == (4, 0, None)


@pytest.mark.timeout(120)
def test_member_names_that_escape_are_left_out_and_listed(twins: tuple[Path, Path], tmp_path: Path) -> None:
    tree, tars = twins
    image = (tree / "val" / "ILSVRC2012_val_00000001.JPEG").read_bytes()
    src = tmp_path / "src"
    src.mkdir()
    os.link(tars / DEVKIT_NAME, src / DEVKIT_NAME)
    names = ["./ILSVRC2012_val_00000001.JPEG", "../ILSVRC2012_val_00000002.JPEG", "/abs/ILSVRC2012_val_00000003.JPEG",
             "._ILSVRC2012_val_00000004.JPEG", "README.txt"]  # fmt: skip
    with tarfile.open(src / VAL_TAR, "w", format=tarfile.GNU_FORMAT) as archive:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = len(image)
            archive.addfile(info, io.BytesIO(image))
    report = pack(src, tmp_path / "out", workers=1, progress=False)
    assert report.records == {"val": 1}
    assert (tmp_path / "out" / "val.sources.txt").read_text() == f"{VAL_TAR}/ILSVRC2012_val_00000001.JPEG\n"
    assert sorted(s.path for s in report.skipped) == [
        f"{VAL_TAR}/../ILSVRC2012_val_00000002.JPEG",
        f"{VAL_TAR}//abs/ILSVRC2012_val_00000003.JPEG",
    ]
    assert all("climbs out" in s.reason for s in report.skipped)
    verified = imgpipe("verify", tmp_path / "out")
    assert verified.returncode == 0, verified.stdout


def test_synth_tars_command_writes_the_three_files_once(tmp_path: Path) -> None:
    args = (
        "synth",
        tmp_path / "tars",
        "--tars",
        "--classes",
        "2",
        "--per-class",
        "2",
        "--val-per-class",
        "1",
        "--min-side",
        "16",
        "--max-side",
        "32",
    )
    first = imgpipe(*args)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (tmp_path / "tars").iterdir()) == sorted([".imgpipe-synth.json", TRAIN_TAR, VAL_TAR, DEVKIT_NAME])
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "tars").iterdir()}
    again = imgpipe(*args)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "tars").iterdir()} == stamps


@pytest.mark.timeout(120)
def test_a_tar_or_devkit_the_user_may_not_read_says_so_without_download_advice(twins: tuple[Path, Path], tmp_path: Path) -> None:
    """chmod 000, met as a plain user (tests/_fs.py); the bytes are fine, so downloading again would not help."""
    _, tars = twins
    src = Path(shutil.copytree(tars, tmp_path / "src"))  # a copy: copy_with's hard links share the originals' modes
    named = (src / TRAIN_TAR, src / VAL_TAR)
    for name, given in ((TRAIN_TAR, (src,)), (VAL_TAR, (src,)), (DEVKIT_NAME, (src,)), (TRAIN_TAR, named)):
        (src / name).chmod(0)
        try:
            result = subprocess.run(
                [sys.executable, "-m", "imgpipe", "pack", *map(str, given), str(tmp_path / "out")],
                capture_output=True,
                text=True,
                timeout=120,
                preexec_fn=as_plain_user,
            )
        finally:
            (src / name).chmod(0o644)
        assert_one_line_error(result, f"{src / name}: cannot ", "Permission denied (EACCES)", "read access")
        assert "download" not in result.stderr, result.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("meta", [b"", b"\0" * 200, b"<html><body>404 Not Found</body></html>\n"])
def test_a_devkit_whose_meta_mat_is_not_a_matlab_file_is_one_line(twins: tuple[Path, Path], tmp_path: Path, meta: bytes) -> None:
    _, tars = twins
    devkit = io.BytesIO()
    with tarfile.open(fileobj=devkit, mode="w:gz") as archive:
        for member, data in ((META, meta), (GROUND_TRUTH, b"1\n")):
            info = tarfile.TarInfo(f"ILSVRC2012_devkit_t12/{member}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    src = copy_with(tars, tmp_path / "src", **{DEVKIT_NAME: devkit.getvalue()})
    result = imgpipe("pack", src, tmp_path / "out", "--workers", "1")
    assert_one_line_error(result, f"{DEVKIT_NAME}: {META}: unreadable, not a MATLAB file", f"download {DEVKIT_NAME} again")


@pytest.mark.timeout(120)
def test_without_scipy_the_val_csv_beside_the_tars_labels_val(twins: tuple[Path, Path], tmp_path: Path) -> None:
    """The devkit's meta.mat needs scipy; Kaggle's LOC_val_solution.csv beside the val tar gives the same labels without it."""
    tree, tars = twins
    src = copy_with(tars, tmp_path / "src")
    shutil.copy(tree / "LOC_val_solution.csv", src)
    no_scipy = "import sys; sys.modules['scipy'] = None; from imgpipe.cli import main; main()"
    args = [str(src), "--shards", "train=2,val=1", "--workers", "1", "--no-progress"]
    without = subprocess.run(
        [sys.executable, "-c", no_scipy, "pack", *args[:1], str(tmp_path / "csv"), *args[1:]], capture_output=True, text=True, timeout=120
    )
    assert without.returncode == 0, without.stderr
    assert imgpipe("pack", *args[:1], tmp_path / "devkit", *args[1:]).returncode == 0
    assert (tmp_path / "csv" / "val.labels.npy").read_bytes() == (tmp_path / "devkit" / "val.labels.npy").read_bytes()
    assert load_manifest(tmp_path / "csv").splits["val"].records == load_manifest(tmp_path / "devkit").splits["val"].records > 0
