"""Shared fixtures, made once per session: a small synthetic ImageNet tree and that tree packed
(``packed_dir``), other synthetic packs (``synth_pack``, ``indexed``), all written by ``imgpipe.pack``,
and the tree's train images as MXNet's own im2rec writes them (``im2rec_files``).

Treat them as read-only: copy them (``shutil.copytree``, or ``_packs.with_payloads`` to damage records) before
changing anything.

Reference tools (MXNet's venv, DALI) must not vanish into skips where they are required:

* ``IMGPIPE_MXNET_PYTHON`` set but not an interpreter that imports mxnet: the tests that need
  it fail (a broken reference is a broken setup, whoever runs the tests).
* DALI installed but not importable: its tests fail.
* ``IMGPIPE_STRICT_DEPS=1`` (``make test`` sets it): a missing MXNet venv or DALI fails too;
  any skip whose reason names one of ``STRICT_TOOLS`` (DALI, MXNet, python-isal, moto, obstore
  and boto3 for the remote tests, imgpipe's C extensions, the install tests' build venv and mount
  namespace; from these fixtures, a skipif, importorskip) is reported as a failure. Without it,
  plain ``pytest`` skips what is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest
from _packs import INDEXED_RECORDS

# Tests send SIGINT (Ctrl-C) to the commands they start. A runner started in the background without
# job control (`cmd &` in a script, nohup) inherits SIGINT ignored, and so would every command a
# test starts: give this process Python's own handler back, which exec resets to the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

STRICT_ENV = "IMGPIPE_STRICT_DEPS"
MXNET_ENV = "IMGPIPE_MXNET_PYTHON"
STRICT_TOOLS = (
    "dali",
    "mxnet",
    "python-isal",
    "moto",
    "obstore",
    "boto3",
    "_jpeg_shrink is not built",
    "region decoder was not built",
    "install test",  # tests/test_install.py: make wheel's build venv, unshare -m
)  # a skip naming one fails under make test

SYNTH_CLASSES = 4
SYNTH_PER_CLASS = 12
SYNTH_VAL_PER_CLASS = 3


@pytest.fixture(scope="session")
def synth_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``train/<wnid>/*.JPEG`` (4 classes x 12), flat ``val/`` (3 per class) + ``LOC_val_solution.csv``; 64-160 px."""
    from imgpipe.synth.tree import make_synthetic

    root = tmp_path_factory.mktemp("synth") / "imagenet"
    make_synthetic(
        root,
        classes=SYNTH_CLASSES,
        per_class=SYNTH_PER_CLASS,
        val_per_class=SYNTH_VAL_PER_CLASS,
        seed=0,
        min_side=64,
        max_side=160,
        progress=False,
    )
    return root


@pytest.fixture(scope="session")
def packed_dir(synth_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``synth_tree`` packed into 2 train shards + 1 val shard (no resize, shuffled with seed 0): 48 + 12 records."""
    from imgpipe.packing.packer import pack

    dst = tmp_path_factory.mktemp("packed") / "packed"
    pack(synth_tree, dst, shards="train=2,val=1", workers=1, progress=False)
    return dst


@pytest.fixture(scope="session")
def synth_pack(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``synth_pack(classes=, per_class=, shards=, min_side=, max_side=, shuffle=)``: a synthetic train split
    (``imgpipe.synth``) packed by ``imgpipe.pack``, made once per session for each set of arguments."""
    from imgpipe.packing.packer import pack
    from imgpipe.synth.tree import make_synthetic

    made: dict[tuple, Path] = {}

    def make(*, classes: int, per_class: int, shards: int = 2, min_side: int = 64, max_side: int = 160, shuffle: bool = True) -> Path:
        key = (classes, per_class, shards, min_side, max_side, shuffle)
        if key not in made:
            root = tmp_path_factory.mktemp("synth-pack")
            sides = dict(min_side=min_side, max_side=max_side)
            make_synthetic(root / "tree", classes=classes, per_class=per_class, val_per_class=0, seed=0, progress=False, **sides)
            pack(root / "tree", root / "packed", shards=f"train={shards}", shuffle=shuffle, workers=1, progress=False)
            made[key] = root / "packed"
        return made[key]

    return make


@pytest.fixture(scope="session")
def indexed(synth_pack: Callable[..., Path]) -> Path:
    """``_packs.INDEXED_RECORDS`` (37) records in 3 train shards, one class each, packed in order: record k's label is k.

    37 is prime: no world size or batch size divides it, so every remainder path runs.
    """
    return synth_pack(classes=INDEXED_RECORDS, per_class=1, shards=3, min_side=40, max_side=96, shuffle=False)


@pytest.fixture(scope="session")
def im2rec_files(synth_tree: Path, tmp_path_factory: pytest.TempPathFactory, mxnet_python: str, im2rec_script: str) -> list[Path]:
    """``synth_tree``'s train images as MXNet's own im2rec writes them (``--pass-through``, 3 chunks, no
    manifest): the bare .rec/.idx files users bring. Their .lst files lie beside them."""
    prefix, images = tmp_path_factory.mktemp("im2rec") / "train", str(synth_tree / "train")
    im2rec = [mxnet_python, im2rec_script]
    subprocess.run([*im2rec, "--list", "--recursive", "--chunks", "3", str(prefix), images], check=True, capture_output=True)
    subprocess.run([*im2rec, "--pass-through", "--num-thread", "1", str(prefix), images], check=True, capture_output=True)
    return sorted(prefix.parent.glob("*.rec"))


def strict_deps() -> bool:
    """True under ``make test``: missing reference tools fail instead of skipping."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def missing(reason: str) -> None:
    """Skip for a tool that is not installed, or fail when ``make test`` requires it."""
    if strict_deps():
        pytest.fail(f"{reason} ({STRICT_ENV}=1: make test requires it)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    """The MXNet 1.9.1 reference interpreter (``make test`` builds it and sets IMGPIPE_MXNET_PYTHON)."""
    python = os.environ.get(MXNET_ENV, "")
    if not python:
        missing(f"{MXNET_ENV} is not set to the MXNet venv's python (make test builds it)")
    probe = [python, "-c", "import mxnet, sys; sys.stdout.write(mxnet.__version__)"]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    except OSError as e:
        pytest.fail(f"{MXNET_ENV}={python} is not an interpreter ({e}); rerun make test to rebuild .venv-mxnet", pytrace=False)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.fail(f"{MXNET_ENV}={python} cannot import mxnet ({last}); rerun make test to rebuild .venv-mxnet", pytrace=False)
    return python


@pytest.fixture(scope="session")
def im2rec_script(mxnet_python: str) -> str:
    """MXNet's own ``tools/im2rec.py``, from the reference venv."""
    code = "import mxnet, os; print(os.path.join(os.path.dirname(mxnet.__file__), 'tools', 'im2rec.py'))"
    return subprocess.run([mxnet_python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def dali_problem() -> str | None:
    """None when DALI imports; else why not. Raises nothing: a broken install is reported by ``require_dali``."""
    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
        return "not installed"
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except Exception as e:  # any failure of an installed wheel: ImportError, OSError on a missing library
        return f"installed but broken: {type(e).__name__}: {e}"
    return None


@pytest.fixture(scope="session")
def require_dali() -> None:
    """Skip without DALI (fail under make test); fail when DALI is installed but does not import."""
    problem = dali_problem()
    if problem == "not installed":
        missing("NVIDIA DALI is not installed (pip install 'imgpipe[dali]')")
    elif problem is not None:
        pytest.fail(f"NVIDIA DALI is {problem}; reinstall it (pip install --force-reinstall 'imgpipe[dali]')", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport() -> Iterator[None]:
    """A skip of a test that needs one of ``STRICT_TOOLS`` (by any route: skipif, skip(), importorskip) becomes
    a failure under make test, and for DALI also whenever DALI is installed but broken."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    named = [tool for tool in STRICT_TOOLS if tool in reason.lower()]  # a GPU-only skip stays a skip
    dali = "dali" in named
    if strict_deps() and named:
        why = (
            f"{STRICT_ENV}=1 (make test) requires DALI, the MXNet venv, python-isal, moto, obstore and boto3 (the dev extra)"
            " and imgpipe's C extensions"
        )
    elif dali and dali_problem() not in (None, "not installed"):
        why = f"NVIDIA DALI is {dali_problem()}"
    else:
        return
    report.outcome = "failed"
    report.longrepr = f"skipped, but {why}: {reason}"


@pytest.fixture(params=["libjpeg-turbo", "pillow"])
def scan_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which check ``codec.keep_failure`` makes: the extension's, or (hidden as on an installation
    built without a compiler; pack's workers are forked, so they inherit it) Pillow's whole decode."""
    from imgpipe.image import codec

    if request.param == "pillow":
        monkeypatch.setattr(codec, "_scan_problem", None)
    elif codec._scan_problem is None:
        pytest.skip("imgpipe.image._jpeg_shrink is not built")
    return request.param
