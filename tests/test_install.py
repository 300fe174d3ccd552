"""imgpipe's installs as a user meets them: the manylinux wheel ``make wheel`` builds, in a fresh venv with
the system's libjpeg hidden, and a build from source where libjpeg-turbo's headers are missing.
Their skips fail under make test (tests/conftest.py's STRICT_TOOLS names "install test").

The system's files are hidden in a mount namespace of the command alone (``unshare -m``, /dev/null
bind-mounted over them); the wheel is built by make wheel's own script with the build venv that
``make test`` makes (IMGPIPE_WHEEL_PYTHON), once per run however many xdist workers ask for it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock
from PIL import Image

import imgpipe
from imgpipe.loaders.pixels import region_decoder

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "tools" / "build_wheel.py"
WHEEL_ENV = "IMGPIPE_WHEEL_PYTHON"
PACK_DEPS = ("click", "tqdm", "Pillow", "numpy", "PyYAML", "psutil")  # what pack and the decoder import (pack never imports torch)
NOT_BUILT = "WARNING: imgpipe's C extensions over libjpeg-turbo were not built"
DECODE = (  # run by the wheel's venv: the region decoder's bytes for each box of argv[2]
    "import json, sys\n"
    "from imgpipe.image._jpeg_region import LIBJPEG_TURBO_VERSION, decode_region\n"
    "data = open(sys.argv[1], 'rb').read()\n"
    "sys.stdout.buffer.write(LIBJPEG_TURBO_VERSION.encode() + b'\\n')\n"
    "for box in json.loads(sys.argv[2]):\n"
    "    sys.stdout.buffer.write(decode_region(data, *box))\n"
)


def pinned_libjpeg_turbo() -> str:
    """The libjpeg-turbo version make wheel pins (tools/build_wheel.py)."""
    spec = importlib.util.spec_from_file_location("build_wheel", BUILD_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LIBJPEG_TURBO


def wheel_python() -> str:
    """make wheel's build venv, which make test builds; skipped (failed under make test) without it."""
    python = os.environ.get(WHEEL_ENV, "")
    if not python:
        pytest.skip(f"install test: {WHEEL_ENV} is not set to make wheel's build venv (make test builds .venv-wheel and sets it)")
    return python


def hidden(paths: list[str], command: list[str]) -> list[str]:
    """``command`` run in a mount namespace of its own where each of ``paths`` reads as an empty file."""
    mounts = " && ".join(f"mount --bind /dev/null {shlex.quote(p)}" for p in paths)
    return ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"', "sh", *command]


def hideable(*paths: str) -> list[str]:
    """``paths``, once it is known that a command can be run with them hidden (root, or unprivileged user namespaces)."""
    probe = subprocess.run(hidden(list(paths), ["true"]), capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"install test: cannot hide {', '.join(paths)} (unshare -m, mount --bind): {probe.stderr.strip()}")
    return list(paths)


def linked_libjpeg() -> str:
    """The libjpeg the in-tree region decoder loads (ldd)."""
    module = importlib.util.find_spec("imgpipe.image._jpeg_region")
    if region_decoder() is None or module is None:
        pytest.skip("the region decoder was not built (no libjpeg-turbo headers): nothing to compare the wheel with")
    found = re.search(r"libjpeg\.so\S* => (\S+)", subprocess.run(["ldd", module.origin], capture_output=True, text=True).stdout)
    assert found, f"ldd finds no libjpeg linked by {module.origin}"
    return found.group(1)


def system_jpeglib_h() -> str:
    """The jpeglib.h a build from source compiles against (the C compiler's own search)."""
    deps = subprocess.run(["cc", "-M", "-x", "c", "-"], input="#include <stdio.h>\n#include <jpeglib.h>\n", capture_output=True, text=True)
    found = re.search(r"(\S+/jpeglib\.h)", deps.stdout)
    if found is None:
        pytest.skip("no jpeglib.h for the C compiler: a build from source here has no extensions to lose")
    return found.group(1)


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, **kwargs)
    assert done.returncode == 0, f"{shlex.join(command)}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the manylinux wheel, built once per test run (xdist workers share them) with the machine's own
    libjpeg-turbo headers and library hidden: the wheel carries the pinned one whatever the machine has."""
    python = wheel_python()
    system = hideable(system_jpeglib_h(), linked_libjpeg())
    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared
    dist = shared / "imgpipe-dist"
    with FileLock(str(shared / "imgpipe-dist.lock")):
        if not (dist / "done").is_file():
            run(hidden(system, [python, str(BUILD_SCRIPT), "--dist", str(dist)]))
            (dist / "done").touch()
    return dist


@pytest.fixture(scope="session")
def wheel_venv(built_dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and only what pack and the decoder need, at the versions of this venv."""
    (wheel,) = built_dist.glob("*manylinux*.whl")
    venv = tmp_path_factory.mktemp("wheel-venv")
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "--quiet", *(f"{d}=={importlib.metadata.version(d)}" for d in PACK_DEPS)])
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)])
    return venv


def test_the_wheel_decodes_and_packs_as_the_in_tree_build_with_the_system_libjpeg_hidden(
    wheel_venv: Path, synth_tree: Path, tmp_path: Path
) -> None:
    (libjpeg,) = hideable(linked_libjpeg())
    python = str(wheel_venv / "bin" / "python")
    in_tree = subprocess.run(hidden([libjpeg], [sys.executable, "-c", "import imgpipe.image._jpeg_region"]), capture_output=True, text=True)
    assert in_tree.returncode != 0 and "libjpeg" in in_tree.stderr, "the system's libjpeg was not hidden: " + in_tree.stderr[-500:]

    jpeg = next((synth_tree / "train").rglob("*.JPEG"))
    data = jpeg.read_bytes()
    width, height = Image.open(io.BytesIO(data)).size
    boxes = [(0, 0, width, height, 1), (width // 5, height // 3, width // 2, height // 2, 1), (0, 0, -(-width // 2), -(-height // 2), 2)]
    raw = subprocess.run(hidden([libjpeg], [python, "-I", "-c", DECODE, str(jpeg), json.dumps(boxes)]), capture_output=True, timeout=120)
    assert raw.returncode == 0, raw.stderr.decode()[-2000:]
    version, decoded = raw.stdout.split(b"\n", 1)
    assert version.decode() == pinned_libjpeg_turbo()
    decode = region_decoder()
    assert decoded == b"".join(bytes(decode(data, *box)) for box in boxes)  # the in-tree build's pixels
    whole = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert decoded[: width * height * 3] == whole.tobytes()  # and a whole decode's

    mine, theirs = tmp_path / "in-tree", tmp_path / "wheel"
    imgpipe.pack(synth_tree, mine, resize=48, workers=1, progress=False)
    pack = ["pack", str(synth_tree), str(theirs), "--resize", "48", "--workers", "1", "--no-progress"]
    run(hidden([libjpeg], [python, "-I", "-m", "imgpipe", *pack]))
    assert '"resizer": "libjpeg-turbo"' in (theirs / "manifest.json").read_text()  # the wheel's shrinker made them, not Pillow
    files = sorted(p.name for p in mine.iterdir() if p.is_file())  # the packed folder; not the journal beside it
    assert files == sorted(p.name for p in theirs.iterdir() if p.is_file()) and any(f.endswith(".rec") for f in files)
    assert [f for f in files if (mine / f).read_bytes() != (theirs / f).read_bytes()] == []


@pytest.mark.parametrize("headers", ["missing", "installed"])
def test_a_build_from_source_says_on_the_terminal_when_the_extensions_are_not_built(built_dist: Path, tmp_path: Path, headers: str) -> None:
    """pip builds the sdist as a user's ``pip install`` does, in a terminal (script gives it one), without -v."""
    python = wheel_python()
    if shutil.which("script") is None:
        pytest.skip("install test: util-linux's script is not installed, to give pip a terminal")
    (sdist,) = built_dist.glob("*.tar.gz")
    pip = [python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp_path), str(sdist)]
    command = ["script", "-qec", shlex.join(pip), "/dev/null"]
    if headers == "missing":
        command = hidden(hideable(system_jpeglib_h()), command)
    terminal = run(command, stdin=subprocess.DEVNULL).stdout
    (wheel,) = tmp_path.glob("*.whl")
    extensions = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
    if headers == "missing":
        assert extensions == [] and terminal.count(NOT_BUILT) == 1, terminal[-3000:]
        assert "imgpipe.image._jpeg_region, imgpipe.image._jpeg_shrink" in terminal and "libjpeg62-turbo-dev" in terminal
    else:
        assert len(extensions) == 2 and NOT_BUILT not in terminal, terminal[-3000:]
