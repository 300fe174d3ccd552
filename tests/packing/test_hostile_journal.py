"""A pack journal (``.imgpipe-pack/``) damaged or written by hand: every JSON file of it that pack, verify
and info read back is one line naming the file and what to do, never a traceback, whatever its bytes."""

from __future__ import annotations

import io
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from _cli import assert_one_line_error

from imgpipe.errors import DatasetError, PackError
from imgpipe.format.info import describe
from imgpipe.format.verify import verify
from imgpipe.packing.journal import JOURNAL_DIR, PARTS_NAME
from imgpipe.packing.packer import pack
from imgpipe.packing.progress import progress_path

SHARDS = 4  # train 4, val 4: node 0 of 2 writes shards 0, 2, 4 and 6
ENTRY = "train-00000-of-00004.json"

HOSTILE: dict[str, Callable[[bytes], bytes]] = {
    "Infinity": lambda good: good.replace(b'"count": 2', b'"count": Infinity').replace(b'"shards": 8', b'"shards": Infinity')
    .replace(b'"records":12', b'"records":Infinity'),
    "1e400": lambda good: good.replace(b'"count": 2', b'"count": 1e400').replace(b'"shards": 8', b'"shards": 1e400')
    .replace(b'"records":12', b'"records":1e400'),
    "NaN": lambda good: good.replace(b'"count": 2', b'"count": NaN').replace(b'"shards": 8', b'"shards": NaN')
    .replace(b'"records":12', b'"records":NaN'),
    "nested 100,000 deep": lambda good: b"[" * 100_000 + b"]" * 100_000,
    "a number of 5,000 digits": lambda good: b"1" * 5000,
    "not UTF-8": lambda good: b"\xff\xfe" + good,
    "truncated": lambda good: good[: len(good) // 2],
    "a list": lambda good: b"[1, 2]",
    "a wrong type": lambda good: good.replace(b'"count": 2', b'"count": "2"').replace(b'"shards": 8', b'"shards": [8]')
    .replace(b'"records":12', b'"records":true'),
    "a key twice": lambda good: good.replace(b'"count": 2', b'"count": 1, "count": 2').replace(b'"shards": 8', b'"shards": 1, "shards": 8')
    .replace(b'"records":12', b'"records":0,"records":12'),
    "a float count": lambda good: good.replace(b'"count": 2', b'"count": 2.5').replace(b'"shards": 8', b'"shards": 8.5')
    .replace(b'"records":12', b'"records":12.5'),
}  # fmt: skip
FIX = {
    PARTS_NAME: "delete it once no node of this pack runs, then rerun",
    "plan.json": "pass --overwrite (or, with --num-nodes, empty DST) to start again",
    ENTRY: "delete it to rewrite that shard",
}


@pytest.fixture(scope="module")
def half_packed(synth_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Node 0 of a pack in 2 parts, finished: its journal holds parts.json, plan.json and 4 shard entries."""
    dst = tmp_path_factory.mktemp("half") / "out"
    pack(synth_tree, dst, shards=SHARDS, num_nodes=2, node_rank=0, workers=1, progress=False)
    journal = dst / JOURNAL_DIR
    assert b'"count": 2' in (journal / PARTS_NAME).read_bytes() and b'"shards": 8' in (journal / "plan.json").read_bytes()
    assert b'"records":12' in (journal / ENTRY).read_bytes()
    return dst


def damaged(half_packed: Path, tmp_path: Path, name: str, how: str) -> Path:
    dst = tmp_path / "out"
    shutil.copytree(half_packed, dst)
    path = dst / JOURNAL_DIR / name
    hostile = HOSTILE[how](path.read_bytes())
    assert hostile != path.read_bytes()
    path.write_bytes(hostile)
    return dst


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", list(HOSTILE))
@pytest.mark.parametrize("name", [PARTS_NAME, "plan.json", ENTRY])
def test_a_hostile_journal_file_is_one_pack_error_naming_it_and_the_fix(
    half_packed: Path, synth_tree: Path, tmp_path: Path, name: str, how: str
) -> None:
    dst = damaged(half_packed, tmp_path, name, how)
    with pytest.raises(PackError) as info:
        pack(synth_tree, dst, shards=SHARDS, num_nodes=2, node_rank=1, workers=1, progress=False)
    message = str(info.value)
    assert message.startswith(f"{dst / JOURNAL_DIR / name}: unreadable ") and message.endswith(FIX[name]), message
    assert "\n" not in message
    assert not (dst / "manifest.json").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", list(HOSTILE))
def test_verify_and_info_on_a_hostile_plan_say_the_pack_is_unfinished_in_one_line(half_packed: Path, tmp_path: Path, how: str) -> None:
    dst = damaged(half_packed, tmp_path, "plan.json", how)
    report = verify(dst, workers=1, progress=False)
    assert not report.ok and len(report.problems) == 1
    problem = str(report.problems[0])
    assert "incomplete pack" in problem and "no manifest.json" in problem and "\n" not in problem
    with pytest.raises(DatasetError, match="incomplete pack") as info:
        describe(dst)
    assert str(info.value).partition(": ")[2] == problem.partition(": ")[2]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("count", [b"-1", b"-0", b"2", str(2**64).encode()])
def test_a_planned_shard_count_that_cannot_be_true_is_unknown_not_told(half_packed: Path, tmp_path: Path, count: bytes) -> None:
    """plan.json's count of shards below the 4 journaled, or more than 5-digit shard names number: it said 'all -1 shards
    written' and '18446744073709551612 of 18446744073709551616 shards missing'."""
    dst = tmp_path / "out"
    shutil.copytree(half_packed, dst)
    plan = dst / JOURNAL_DIR / "plan.json"
    plan.write_bytes(plan.read_bytes().replace(b'"shards": 8', b'"shards": ' + count))
    with pytest.raises(DatasetError) as info:
        describe(dst)
    assert str(info.value) == (f"{dst}: incomplete pack: 4 shard(s) finished, the planned count is unknown, no manifest.json; "
                               "rerun the same 'imgpipe pack' (with --num-nodes: every --node-rank, then --finalize)")  # fmt: skip


@pytest.mark.timeout(180)
@pytest.mark.parametrize("command", ["pack", "verify", "info"])
def test_the_cli_says_one_line_and_exits_non_zero_on_a_plan_nested_100000_deep(
    half_packed: Path, synth_tree: Path, tmp_path: Path, command: str
) -> None:
    dst = damaged(half_packed, tmp_path, "plan.json", "nested 100,000 deep")
    args = [synth_tree, dst, "--shards", SHARDS, "--num-nodes", 2, "--node-rank", 1, "--workers", 1] if command == "pack" else [dst]
    result = subprocess.run([sys.executable, "-m", "imgpipe", command, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr and result.returncode == 1, result.stderr[-3000:]
    if command == "verify":
        assert "plan.json is unreadable (not valid JSON: nested too deep)" in result.stdout
    else:
        assert_one_line_error(result, "plan.json", "nested too deep", "--overwrite")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("meta", [b"[" * 100_000 + b"]" * 100_000, b'{"side_bytes": Infinity}', b'{"side_bytes": 1e400}'])
def test_a_hostile_checkpoint_is_read_past_with_a_warning(
    half_packed: Path, synth_tree: Path, tmp_path: Path, meta: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint's metadata nobody wrote (its arrays empty): the records are read again, and the pack finishes."""
    dst = tmp_path / "out"
    shutil.copytree(half_packed, dst)
    arrays = {name: np.zeros(0, np.int64) for name in ("shard", "position", "action", "length", "crc", "side", "read")}
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(meta, np.uint8), **arrays)
    progress_path(dst / JOURNAL_DIR, 1).write_bytes(buffer.getvalue())
    with caplog.at_level(logging.WARNING):
        report = pack(synth_tree, dst, shards=SHARDS, num_nodes=2, node_rank=1, workers=1, progress=False)
    assert report.manifest is not None and verify(dst, workers=1, progress=False).ok
    assert "unreadable checkpoint" in caplog.text


def _flipped_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(b'{"side_bytes": 0}', np.uint8))
    data = bytearray(buffer.getvalue())
    data[data.index(b"{")] ^= 1  # inside the stored member: its crc32 no longer matches
    return bytes(data)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["empty", "not a zip", "a bit flipped"])
def test_a_damaged_checkpoint_file_is_read_past_with_a_warning(
    half_packed: Path, synth_tree: Path, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The progress file's own bytes damaged (numpy and zipfile raise EOFError and BadZipFile): read past, as its metadata."""
    dst = tmp_path / "out"
    shutil.copytree(half_packed, dst)
    damaged_bytes = {"empty": b"", "not a zip": b"PK\x03\x04" + bytes(60), "a bit flipped": _flipped_npz()}[how]
    progress_path(dst / JOURNAL_DIR, 1).write_bytes(damaged_bytes)
    with caplog.at_level(logging.WARNING):
        report = pack(synth_tree, dst, shards=SHARDS, num_nodes=2, node_rank=1, workers=1, progress=False)
    assert report.manifest is not None and verify(dst, workers=1, progress=False).ok
    assert "unreadable checkpoint" in caplog.text


def test_a_journal_entry_that_does_not_fit_its_shard_is_refused_before_the_manifest(
    half_packed: Path, synth_tree: Path, tmp_path: Path
) -> None:
    """Well-formed, typed, and still not this shard's: a skipped position outside the shard."""
    dst = tmp_path / "out"
    shutil.copytree(half_packed, dst)
    entry = dst / JOURNAL_DIR / ENTRY
    data = json.loads(entry.read_text())
    data["skipped"] = [[10**6, "not an image"]]
    entry.write_text(json.dumps(data))
    with pytest.raises(PackError, match=rf"{entry}: .*; delete it to rewrite that shard"):
        pack(synth_tree, dst, shards=SHARDS, num_nodes=2, node_rank=1, workers=1, progress=False)
    assert not (dst / "manifest.json").exists()


@pytest.mark.timeout(120)
def test_a_folder_where_the_manifest_goes_is_named_with_what_to_do(half_packed: Path, synth_tree: Path, tmp_path: Path) -> None:
    """It said 'writing the sidecars and manifest.json failed: Is a directory (EISDIR); then rerun the same command', which
    fails the same way for ever."""
    dst = tmp_path / "out"
    shutil.copytree(half_packed, dst)
    (dst / "manifest.json").mkdir()
    with pytest.raises(PackError) as info:
        pack(synth_tree, dst, shards=SHARDS, num_nodes=2, node_rank=1, workers=1, progress=False)
    assert str(info.value) == (
        f"DST {dst}: writing the sidecars and manifest.json failed: {dst / 'manifest.json'}: Is a directory (EISDIR); a folder is in "
        "the way: move it away; then rerun the same command to finish (every shard is written)"
    )
