"""The JSON files imgpipe reads back besides the pack journal (tests/packing/test_hostile_journal.py): the
manifest, a synthetic tree's marker, a stage's failure record. Hostile bytes are one error naming the file
and the fix, or, where the file is only a hint, ignored; never a traceback."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgpipe.errors import DatasetError
from imgpipe.format.info import describe
from imgpipe.format.shardset import open_shardset
from imgpipe.format.verify import verify
from imgpipe.staging.target import LocalTarget
from imgpipe.staging.waiting import _read_failure
from imgpipe.synth.tree import make_synthetic

HOSTILE = {
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "Infinity": b'{"args": Infinity, "summary": {}, "time": Infinity, "error": "x"}',
    "1e400": b'{"args": {}, "summary": {}, "time": 1e400, "error": "x"}',
    "a time of 400 digits": b'{"time": 1' + b"0" * 400 + b', "error": "x"}',
    "not UTF-8": b'\xff{"time": 1}',
    "truncated": b'{"args": {"cla',
    "a list": b"[1, 2]",
}


def refused_by_every_reader(dst: Path, pattern: str) -> list[str]:
    """What verify, info and opening (the loaders') each refuse ``dst`` with: a DatasetError matching ``pattern``."""
    said = []
    for read in (lambda: verify(dst, workers=1, progress=False), lambda: describe(dst), lambda: open_shardset(dst, "train")):
        with pytest.raises(DatasetError, match=pattern) as info:
            read()
        said.append(str(info.value))
    return said


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", list(HOSTILE))
def test_a_hostile_manifest_is_one_line_in_verify_info_and_opening(packed_dir: Path, tmp_path: Path, how: str) -> None:
    dst = tmp_path / "out"
    shutil.copytree(packed_dir, dst)
    (dst / "manifest.json").write_bytes(HOSTILE[how])
    said = refused_by_every_reader(dst, rf"^{dst / 'manifest.json'}: (unreadable manifest|not an imgpipe manifest)")
    assert not any("\n" in line for line in said)


@pytest.mark.parametrize("how", list(HOSTILE))
def test_a_hostile_synth_marker_is_one_line(tmp_path: Path, how: str) -> None:
    small = dict(classes=2, per_class=1, val_per_class=1, min_side=32, max_side=40, progress=False)
    out = tmp_path / "synth"
    make_synthetic(out, **small)
    marker = out / ".imgpipe-synth.json"
    marker.write_bytes(HOSTILE[how])
    with pytest.raises(DatasetError, match=rf"^{marker}: unreadable synth marker \(.*\); delete {out} and rerun synth$"):
        make_synthetic(out, **small)


@pytest.mark.parametrize("how", list(HOSTILE))
def test_a_hostile_stage_failure_record_is_no_failure(tmp_path: Path, how: str) -> None:
    """Processes waiting for the node's stage read why it failed from this record; bytes that are not one are no failure."""
    target = LocalTarget(tmp_path / "dst")
    target.journal.mkdir(parents=True)
    target.failure_path.write_bytes(HOSTILE[how])
    assert _read_failure(target, 0.0) is None
    target.failure_path.write_text(json.dumps({"time": 5.0, "error": "disk full"}))
    assert _read_failure(target, 0.0) == "disk full"


@pytest.mark.timeout(60)
def test_the_cli_says_one_line_for_a_manifest_nested_100000_deep(packed_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    shutil.copytree(packed_dir, dst)
    (dst / "manifest.json").write_bytes(HOSTILE["nested 100,000 deep"])
    for command in ("verify", "info"):
        result = subprocess.run([sys.executable, "-m", "imgpipe", command, str(dst)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        why = "unreadable manifest (not valid JSON: nested too deep); rerun 'imgpipe pack' to rewrite it"
        assert result.stderr.strip() == f"imgpipe: error: {dst / 'manifest.json'}: {why}"


def edited(packed_dir: Path, tmp_path: Path, edit) -> Path:
    dst = tmp_path / "out"
    shutil.copytree(packed_dir, dst)
    text = (dst / "manifest.json").read_text()
    (dst / "manifest.json").write_text(edit(text, json.loads(text)))
    return dst


@pytest.mark.timeout(60)
@pytest.mark.parametrize("records", ["-1", "Infinity", "1e400", "4.8e1", '"48"', "47", "49"])
def test_a_splits_record_count_unlike_its_shards_is_refused_by_verify_and_opening(packed_dir: Path, tmp_path: Path, records: str) -> None:
    dst = edited(packed_dir, tmp_path, lambda text, m: text.replace('"records": 48,', f'"records": {records},', 1))
    assert f'"records": {records},' in (dst / "manifest.json").read_text()
    refused_by_every_reader(dst, rf"^{dst / 'manifest.json'}: .*(split train has records|not valid JSON).*; rerun 'imgpipe pack'")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("key", "value", "refused"),
    [
        ("classes", "abcd", "Manifest classes is 'abcd', not list"),  # was read as 4 classes: 'a', 'b', 'c', 'd'
        ("classes", {"n01": 0, "n02": 1}, "Manifest classes is {'n01': 0, 'n02': 1}, not list"),
        ("source", ["/data"], "Manifest source is ['/data'], not str"),
        ("fingerprint", 5, "Manifest fingerprint is 5, not str"),
        ("layout", None, "Manifest layout is null, not str"),
        ("options", "abc", "Manifest options is 'abc', not dict"),
        ("version", True, "manifest version True is not supported"),
        ("version", 1.0, "manifest version 1.0 is not supported"),
    ],
)
def test_a_manifest_field_of_another_json_type_is_refused_not_converted(
    packed_dir: Path, tmp_path: Path, key: str, value: object, refused: str
) -> None:
    dst = edited(packed_dir, tmp_path, lambda text, manifest: json.dumps({**manifest, key: value}))
    refused_by_every_reader(dst, rf"^{dst / 'manifest.json'}: .*{re.escape(refused)}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", ['"splits"', '"version"', '"train-00000-of-00002.rec"'])
def test_a_manifest_giving_a_key_twice_is_refused(packed_dir: Path, tmp_path: Path, key: str) -> None:
    """json.loads keeps the last of the two (a split, a shard, the version); imgpipe never writes one twice."""
    twice = {'"splits"': '"splits": {}, "splits"', '"version"': '"version": 1, "version"', '"train-00000-of-00002.rec"': ""}

    def edit(text: str, manifest: dict) -> str:
        if key.startswith('"train'):  # a shard's name given twice inside its entry
            return text.replace(f'"name": {key}', f'"name": "val-00000-of-00001.rec", "name": {key}', 1)
        return text.replace(f"{key}:", f"{twice[key]}:", 1)

    dst = edited(packed_dir, tmp_path, edit)
    refused_by_every_reader(dst, rf"^{dst / 'manifest.json'}: unreadable manifest \(not valid JSON: key .* twice\); rerun")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["in its split", "in another split", "as an index"])
def test_a_manifest_listing_a_shard_twice_is_refused_when_opened(packed_dir: Path, tmp_path: Path, where: str) -> None:
    """Opening it served a wrong record, then failed; now every reader refuses it, as verify did."""

    def twice(text: str, manifest: dict) -> str:
        train, val = manifest["splits"]["train"], manifest["splits"]["val"]
        if where == "in its split":
            train["shards"][1] = dict(train["shards"][0])
        elif where == "in another split":
            val["shards"][0] = dict(train["shards"][0])
        else:
            train["shards"][1]["index"] = train["shards"][0]["index"]
        for split in (train, val):
            split["records"], split["bytes"] = (sum(s[key] for s in split["shards"]) for key in ("records", "bytes"))
        return json.dumps(manifest)

    dst = edited(packed_dir, tmp_path, twice)
    name = json.loads((dst / "manifest.json").read_text())["splits"]["train"]["shards"][0]["index" if where == "as an index" else "name"]
    for split in ("train", "val"):
        with pytest.raises(DatasetError, match=rf"^{dst / 'manifest.json'}: {name} is listed twice; rerun 'imgpipe pack'"):
            open_shardset(dst, split)
    result = subprocess.run([sys.executable, "-m", "imgpipe", "verify", str(dst)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.strip() == f"imgpipe: error: {dst / 'manifest.json'}: {name} is listed twice; " \
        "rerun 'imgpipe pack' to rewrite the manifest"  # fmt: skip
