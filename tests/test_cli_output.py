"""What a command prints is printed whatever characters it holds: a folder name that is not UTF-8 (kept as
surrogate escapes, as Python reads it) or a lone surrogate in a manifest, under the strict UTF-8 output Python
gives a terminal in a UTF-8 locale (PYTHONIOENCODING=utf-8 plays it here, whatever this machine's locale)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgpipe.packing.packer import pack


def info(folder: Path | bytes) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # errors=strict, as in LANG=en_US.UTF-8
    return subprocess.run([sys.executable, "-m", "imgpipe", "info", folder], capture_output=True, env=env, timeout=60)


@pytest.mark.timeout(120)
def test_info_prints_a_source_folder_whose_name_is_not_utf8(synth_tree: Path, tmp_path: Path) -> None:
    src = os.fsencode(tmp_path) + b"/imagenet-\xe9t\xe9"  # latin-1, as an old file server names it
    shutil.copytree(synth_tree, os.fsdecode(src))
    pack(os.fsdecode(src), tmp_path / "out", shards="train=1,val=1", workers=1, progress=False)
    result = info(tmp_path / "out")
    assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr.decode()[-2000:]
    assert b"packed from " + os.fsencode(tmp_path) + b"/imagenet-\\udce9t\\udce9, imagenet layout" in result.stdout


@pytest.mark.timeout(60)
def test_info_prints_a_lone_surrogate_in_a_manifest(packed_dir: Path, tmp_path: Path) -> None:
    dst = Path(shutil.copytree(packed_dir, tmp_path / "packed"))
    manifest = json.loads((dst / "manifest.json").read_text())
    (dst / "manifest.json").write_text(json.dumps({**manifest, "source": "/data/\ud800"}))  # json.dumps escapes it: "\\ud800"
    result = info(dst)
    assert result.returncode == 0 and b"packed from /data/\\ud800," in result.stdout, result.stderr.decode()[-2000:]
