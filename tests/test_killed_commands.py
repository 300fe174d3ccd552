"""kill -9 of a command while its worker processes run: every process it started is gone within
seconds, not orphaned (each calls ``die_with_parent``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "train"))
from proctree import descendants, wait_gone  # noqa: E402

from imgpipe.synth.tree import make_synthetic  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An extracted tree and the same images as timm's WebDataset shards (listed in a pool, then packed in one)."""
    root = tmp_path_factory.mktemp("killed")
    tree = root / "tree"
    make_synthetic(tree, classes=4, per_class=40, val_per_class=0, seed=0, progress=False)
    wds = root / "wds"
    subprocess.run([sys.executable, "-m", "imgpipe", "synth", str(wds), "--classes", "4", "--per-class", "40", "--val-per-class", "0",
                    "--layout", "wds"], check=True, capture_output=True, timeout=120)  # fmt: skip
    return {"tree": tree, "wds": wds}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("command", ["synth", "pack", "pack-wds"])
def test_a_killed_command_leaves_no_worker_behind(command: str, sources: dict[str, Path], tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    argv = {
        "synth": ["synth", out, "--classes", "20", "--per-class", "200", "--workers", "2"],
        "pack": ["pack", str(sources["tree"]), out, "--workers", "2", "--shards", "16", "--resize", "128", "--no-progress"],
        "pack-wds": ["pack", str(sources["wds"]), out, "--workers", "2", "--shards", "16", "--resize", "128", "--no-progress"],
    }[command]
    run = subprocess.Popen([sys.executable, "-m", "imgpipe", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(workers := descendants(run.pid)) < 2 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.01)
    run.kill()
    assert run.wait(timeout=30) == -signal.SIGKILL, f"{command} finished before it was killed: give it more to do"
    assert len(workers) >= 2
    left = wait_gone(workers, 10)
    for pid in left:  # do not leave them running if the check fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{command}'s workers {left} outlived it"
