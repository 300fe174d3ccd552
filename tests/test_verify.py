"""imgpipe.verify finds and locates each injected fault in a real packed folder, and passes a clean one."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _hooks.faults import VERIFY_HOLD_ENV, hook_env

from imgpipe.errors import DatasetError
from imgpipe.format.manifest import load_manifest
from imgpipe.format.recordio import FRAME_HEADER, IR_SIZE, read_index
from imgpipe.format.shardset import open_shardset
from imgpipe.format.verify import verify
from tests.train.proctree import descendants, wait_gone


@pytest.fixture
def dataset(packed_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the session's packed folder, to break."""
    return Path(shutil.copytree(packed_dir, tmp_path / "packed"))


def shard(dst: Path, split: str, number: int) -> tuple[Path, Path, int]:
    """(.rec, .idx, split-wide index of the shard's first record)."""
    manifest = load_manifest(dst)
    shards = manifest.splits[split].shards
    first = sum(s.records for s in shards[:number])
    return dst / shards[number].name, dst / shards[number].index, first


def problem_lines(dst: Path, **kwargs) -> list[str]:
    report = verify(dst, workers=1, progress=False, **kwargs)
    assert not report.ok
    return [str(p) for p in report.problems]


def source_of(dst: Path, split: str, record: int) -> str:
    return (dst / f"{split}.sources.txt").read_text().splitlines()[record]


@pytest.mark.timeout(60)
def test_a_clean_pack_verifies_with_and_without_decoding(packed_dir: Path) -> None:
    plain = verify(packed_dir, workers=2, progress=False)
    assert plain.ok, plain.problems
    assert plain.records == sum(s.records for s in load_manifest(packed_dir).splits.values()) == 60
    assert plain.shards == 3
    decoded = verify(packed_dir, decode=True, workers=1, progress=False)
    assert decoded.ok and decoded.decoded


def test_flipped_payload_byte_is_located(dataset: Path) -> None:
    rec, idx, first = shard(dataset, "train", 1)
    _, offsets = read_index(idx)
    k = 3
    position = int(offsets[k]) + FRAME_HEADER.size + IR_SIZE + 200
    data = bytearray(rec.read_bytes())
    data[position] ^= 0x40
    rec.write_bytes(bytes(data))
    lines = problem_lines(dataset)
    expected = f"{rec.name}: record {first + k} (offset {offsets[k]}, source {source_of(dataset, 'train', first + k)}): checksum mismatch"
    assert any(line.startswith(expected) for line in lines), lines
    assert any(line.startswith(f"{rec.name}: sha256 differs") for line in lines)


def test_truncated_shard_is_located(dataset: Path) -> None:
    rec, idx, first = shard(dataset, "train", 0)
    keys, offsets = read_index(idx)
    with open(rec, "r+b") as f:
        f.truncate(rec.stat().st_size - 100)
    lines = problem_lines(dataset)
    last = len(keys) - 1
    assert any(line.startswith(f"{rec.name}:") and "truncated" in line for line in lines), lines
    assert any(line.startswith(f"{rec.name}: record {first + last} (offset {offsets[last]}") and "framing broken" in line for line in lines)
    assert any(line.startswith(f"{idx.name}: record {first + last} (offset {offsets[last]}") for line in lines)


def test_missing_shard_is_named(dataset: Path) -> None:
    rec, _, _ = shard(dataset, "val", 0)
    rec.unlink()
    lines = problem_lines(dataset)
    assert lines == [f"{rec.name}: missing shard (12 records, {load_manifest(dataset).splits['val'].bytes} bytes expected)"]


def test_edited_index_line_is_located(dataset: Path) -> None:
    rec, idx, first = shard(dataset, "train", 1)
    lines = idx.read_text().splitlines(keepends=True)
    key, offset = lines[2].split("\t")
    lines[2] = f"{key}\t{int(offset) + 4}\n"
    idx.write_text("".join(lines))
    found = problem_lines(dataset)
    assert any(
        line.startswith(f"{idx.name}: record {first + 2} (offset {int(offset) + 4}")
        and "line 3" in line
        and "not the start of a record" in line
        for line in found
    ), found


def test_changed_label_is_located(dataset: Path) -> None:
    rec, idx, first = shard(dataset, "train", 0)
    _, offsets = read_index(idx)
    k = 5
    label_at = int(offsets[k]) + FRAME_HEADER.size + 4  # IRHeader <IfQQ>: flag, then the float label
    with open(rec, "r+b") as f:
        f.seek(label_at)
        old = struct.unpack("<f", f.read(4))[0]
        f.seek(label_at)
        f.write(struct.pack("<f", (old + 1) % 4))
    lines = problem_lines(dataset)
    prefix = f"{rec.name}: record {first + k} (offset {offsets[k]}, source {source_of(dataset, 'train', first + k)}): "
    assert prefix + f"label {int((old + 1) % 4)} differs from the labels sidecar ({int(old)})" in lines, lines
    assert prefix + "checksum mismatch: the record's bytes changed since packing" in lines


def test_decode_finds_an_image_that_does_not_decode(dataset: Path) -> None:
    rec, idx, first = shard(dataset, "val", 0)
    _, offsets = read_index(idx)
    start = int(offsets[1]) + FRAME_HEADER.size + IR_SIZE
    with open(rec, "r+b") as f:
        f.seek(start)
        f.write(b"\0" * 16)  # wipe the JPEG's SOI and first marker
    plain = problem_lines(dataset)
    assert not any("does not decode" in line for line in plain)
    decoded = problem_lines(dataset, decode=True)
    assert any(line.startswith(f"{rec.name}: record {first + 1} (offset {offsets[1]}") and "does not decode" in line for line in decoded)


def test_broken_sidecars_are_reported(dataset: Path) -> None:
    sources = dataset / "train.sources.txt"
    sources.write_text("".join(sources.read_text().splitlines(keepends=True)[:-1]))
    labels = np.load(dataset / "val.labels.npy")
    labels[0] = 99
    np.save(dataset / "val.labels.npy", labels)
    lines = problem_lines(dataset)
    assert "train.sources.txt: sha256 differs from the manifest" in lines
    assert "train.sources.txt: 47 lines, the manifest counts 48 records" in lines
    assert "val.labels.npy: record 0: label 99 is outside 0..3" in lines


@pytest.mark.interop
def test_bare_im2rec_files_without_a_manifest(im2rec_files: list[Path], tmp_path: Path) -> None:
    """A .rec and its .idx that MXNet's im2rec wrote, checked as they are: then one .idx line changed, then the .idx gone."""
    rec, idx = (Path(shutil.copy(im2rec_files[0].with_suffix(suffix), tmp_path)) for suffix in (".rec", ".idx"))
    keys, offsets = read_index(idx)
    assert verify(rec, progress=False).ok
    assert verify(tmp_path, progress=False).records == len(keys)
    lines = idx.read_text().splitlines(keepends=True)
    lines[1] = f"99999\t{offsets[1]}\n"
    idx.write_text("".join(lines))
    report = verify(rec, progress=False)
    assert [str(p) for p in report.problems] == [
        f"{idx.name}: record 1 (offset {offsets[1]}): line 2: key 99999 but the record's IRHeader id is {keys[1]}"
    ]
    idx.unlink()
    assert [str(p) for p in verify(tmp_path, progress=False).problems] == [f"{idx.name}: missing index file"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no manifest.json and no .rec files"):
        verify(tmp_path / "empty", progress=False)
    with pytest.raises(DatasetError, match="not found"):
        verify(tmp_path / "missing", progress=False)


@pytest.mark.interop
@pytest.mark.timeout(120)
def test_im2rec_output_verifies(synth_tree: Path, tmp_path: Path, mxnet_python: str, im2rec_script: str) -> None:
    prefix = tmp_path / "im2rec" / "train"
    prefix.parent.mkdir()
    images = sorted((synth_tree / "train").glob("*/*.JPEG"))
    classes = sorted({p.parent.name for p in images})
    lines = [f"{k}\t{classes.index(p.parent.name)}\t{p.relative_to(synth_tree / 'train')}\n" for k, p in enumerate(images)]
    prefix.with_suffix(".lst").write_text("".join(lines))  # what im2rec --list writes (one MXNet start-up less)
    subprocess.run([mxnet_python, im2rec_script, "--pass-through", "--num-thread", "1", str(prefix), str(synth_tree / "train")],
                   check=True, capture_output=True)  # fmt: skip
    report = verify(prefix.parent, decode=True, progress=False)
    assert report.ok, report.problems
    assert report.records == 48


def test_a_stray_shard_not_in_the_manifest_is_a_problem(dataset: Path) -> None:
    rec, idx, _ = shard(dataset, "train", 0)
    shutil.copy(rec, dataset / "train-00000-of-00003.rec")
    shutil.copy(idx, dataset / "train-00000-of-00003.idx")
    lines = problem_lines(dataset)
    assert lines == [
        f"train-00000-of-00003.{ext}: not listed in manifest.json (left from another pack?); remove it, or repack with --overwrite"
        for ext in ("idx", "rec")
    ]


def test_sources_split_on_newline_only(dataset: Path) -> None:
    import hashlib
    import json

    path = dataset / "train.sources.txt"
    lines = path.read_bytes().split(b"\n")
    lines[0] = "odd\x85name\u2028x\x0cy\rz.JPEG".encode()
    data = b"\n".join(lines)
    path.write_bytes(data)
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["splits"]["train"]["sources_sha256"] = hashlib.sha256(data).hexdigest()
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    assert verify(dataset, workers=1, progress=False).ok


def test_a_source_path_escaping_the_source_folder_is_a_problem(dataset: Path) -> None:
    import hashlib
    import json

    path = dataset / "train.sources.txt"
    lines = path.read_bytes().split(b"\n")
    lines[1], lines[2] = b"../../etc/passwd", b"/etc/shadow"
    data = b"\n".join(lines)
    path.write_bytes(data)
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["splits"]["train"]["sources_sha256"] = hashlib.sha256(data).hexdigest()  # a consistent forgery
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    found = problem_lines(dataset)
    assert any("line 2: source path '../../etc/passwd' escapes the source folder" in p for p in found), found
    assert any("line 3: source path '/etc/shadow' escapes" in p for p in found), found


def test_manifest_path_verifies_its_folder_and_an_idx_is_named(packed_dir: Path) -> None:
    assert verify(packed_dir / "manifest.json", workers=1, progress=False).ok
    idx = shard(packed_dir, "val", 0)[1]
    with pytest.raises(DatasetError, match=r"\.idx: not a \.rec file"):
        verify(idx, workers=1, progress=False)


def test_zero_workers_is_refused(packed_dir: Path) -> None:
    from imgpipe.errors import ConfigError

    with pytest.raises(ConfigError, match="--workers 0: need at least 1"):
        verify(packed_dir, workers=0, progress=False)


def test_float_labels_are_reported_like_open_shards_reports_them(dataset: Path) -> None:
    """verify and open_shards read the labels sidecar with the same reader, so both refuse floats."""
    labels = dataset / "train.labels.npy"
    np.save(labels, np.load(labels).astype(np.float32))
    assert "train.labels.npy: must be a 1-D integer array, got float32 (48,)" in problem_lines(dataset)
    with pytest.raises(DatasetError, match="must be a 1-D integer array, got float32"):
        open_shardset(dataset, "train")


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_verify_leaves_no_worker_behind(packed_dir: Path) -> None:
    """kill -9 of ``imgpipe verify --decode`` mid-run (its shard checks held, as on a disk that stopped answering):
    its pool workers are gone within seconds, not orphaned."""
    verify_run = subprocess.Popen(
        [sys.executable, "-m", "imgpipe", "verify", "--decode", "--workers", "2", "--no-progress", str(packed_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=hook_env(dict(os.environ), **{VERIFY_HOLD_ENV: "1"}),
    )
    deadline = time.monotonic() + 60
    while len(workers := descendants(verify_run.pid)) < 2 and time.monotonic() < deadline and verify_run.poll() is None:
        time.sleep(0.01)
    verify_run.kill()
    assert verify_run.wait(timeout=30) == -signal.SIGKILL, "verify finished before it was killed: is the hold hook installed?"
    assert len(workers) == 2
    left = wait_gone(workers, 10)
    for pid in left:  # do not leave them running if the check fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"verify workers {left} outlived their killed parent"


def test_an_index_sidecar_that_differs_from_the_idx_files_is_located(dataset: Path) -> None:
    """Readers open a split from its index sidecar, MXNet and DALI from the .idx files: verify holds them to one another."""
    import hashlib
    import json

    from imgpipe.format.files import index_bytes, parse_index_sidecar

    path = dataset / "train.index.npy"
    keys, offsets = parse_index_sidecar(path.read_bytes(), open_shardset(dataset).labels.size)
    rec, idx, first = shard(dataset, "train", 1)
    offsets = offsets.copy()
    offsets[first + 2] += 4  # a consistent forgery: the manifest's sha256 follows the sidecar
    data = index_bytes(keys, offsets)
    path.write_bytes(data)
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["splits"]["train"]["index_sidecar_sha256"] = hashlib.sha256(data).hexdigest()
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    found = problem_lines(dataset)
    source = source_of(dataset, "train", first + 2)
    said = f"train.index.npy: record {first + 2} (source {source}): key {keys[first + 2]}, offset {offsets[first + 2]}"
    assert found == [f"{said} but {idx.name} line 3 says key {keys[first + 2]}, offset {offsets[first + 2] - 4}; rerun 'imgpipe pack'"]


def test_a_missing_index_sidecar_is_a_problem(dataset: Path) -> None:
    (dataset / "val.index.npy").unlink()
    assert problem_lines(dataset) == ["val.index.npy: missing sidecar"]
