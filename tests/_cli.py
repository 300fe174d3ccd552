"""Checks shared by the tests that run the real CLI in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("imgpipe: error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def slow_pack_command(src: Path, dst: Path, program: tuple[str, ...] = ("-m", "imgpipe"), *options: str) -> list[str]:
    """``imgpipe pack`` resizing into 8 shards with 2 workers: each shard takes a while, so a kill lands mid-work."""
    slow = ("--shards", "8", "--resize", "64", "--workers", "2", "--no-progress")
    return [sys.executable, *program, "pack", str(src), str(dst), *slow, *options]
