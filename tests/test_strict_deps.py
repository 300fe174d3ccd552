"""The rule in conftest.py, run through a real pytest in a subprocess: reference tools never vanish into skips.

``make test`` sets IMGPIPE_STRICT_DEPS=1: a missing or broken MXNet venv fails, and so does a missing
moto, boto3 or obstore (the remote tests' server and client). A set but broken IMGPIPE_MXNET_PYTHON
fails even without it, and so does an installed DALI that does not import.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INTEROP_TEST = "tests/interop/test_mxnet_recordio.py::test_rec_and_idx_are_byte_identical_to_mxnet"
DALI_TESTS = [
    "tests/loaders/test_dali_loader.py::test_user_errors_are_imgpipe_errors",  # require_dali fixture
    "tests/loaders/test_geometry_parity.py::test_val_outputs_of_both_loaders_agree",  # skipif(not dali_available())
]
REMOTE_TEST = "tests/remote/test_remote_shardset.py::test_a_bad_retry_time_is_a_config_error"  # the s3_server fixture's importorskips


def run_pytest(tests: list[str], *, strict: bool, mxnet: str | None = None, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("IMGPIPE_STRICT_DEPS", "IMGPIPE_MXNET_PYTHON")}
    if strict:
        env["IMGPIPE_STRICT_DEPS"] = "1"
    if mxnet is not None:
        env["IMGPIPE_MXNET_PYTHON"] = mxnet
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs", *tests]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("strict", "mxnet", "fails", "says"),
    [
        (True, None, True, "IMGPIPE_MXNET_PYTHON is not set"),
        (True, "/nonexistent/.venv-mxnet/bin/python", True, "is not an interpreter"),
        (False, sys.executable, True, "cannot import mxnet"),  # set, but not an MXNet venv
        (False, None, False, "IMGPIPE_MXNET_PYTHON is not set"),  # plain pytest without the venv: skipped
    ],
    ids=["strict-unset", "strict-missing-interpreter", "set-but-no-mxnet", "plain-pytest-unset"],
)
def test_mxnet_venv_missing_or_broken(strict: bool, mxnet: str | None, fails: bool, says: str) -> None:
    result = run_pytest([INTEROP_TEST], strict=strict, mxnet=mxnet)
    tail = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"1 (failed|error)" if fails else "1 skipped", tail.split(" in ")[0]), result.stdout[-3000:]
    assert says in result.stdout, result.stdout[-3000:]
    assert (result.returncode != 0) == fails


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strict", [False, True], ids=["plain-pytest", "make-test"])
def test_an_installed_but_broken_dali_fails_instead_of_skipping(tmp_path: Path, strict: bool) -> None:
    """A ``nvidia.dali`` package that raises on import (as a wheel missing a library does) shadows the real one."""
    package = tmp_path / "nvidia" / "dali"
    package.mkdir(parents=True)
    (tmp_path / "nvidia" / "__init__.py").write_text("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")
    (package / "__init__.py").write_text("raise ImportError('libdali.so: cannot open shared object file')\n")
    result = run_pytest(DALI_TESTS, strict=strict, pythonpath=[tmp_path])
    assert re.fullmatch(r"2 (failed|errors)|1 failed, 1 error", result.stdout.strip().splitlines()[-1].split(" in ")[0]), result.stdout[
        -3000:
    ]
    assert result.returncode != 0 and "libdali.so" in result.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("module", "strict"), [("moto", False), ("moto", True), ("boto3", True), ("obstore", True)])
def test_a_missing_moto_boto3_or_obstore_fails_under_make_test(tmp_path: Path, module: str, strict: bool) -> None:
    """A package that is not found (as when it is not installed) shadows the real one; plain pytest skips the remote tests."""
    (tmp_path / module).mkdir()
    (tmp_path / module / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\", name={module!r})\n")
    result = run_pytest([REMOTE_TEST], strict=strict, pythonpath=[tmp_path])
    tail = result.stdout.strip().splitlines()[-1].split(" in ")[0]
    assert re.fullmatch(r"1 (failed|error)" if strict else "1 skipped", tail), result.stdout[-3000:]
    assert (result.returncode != 0) == strict
    if strict:
        assert "IMGPIPE_STRICT_DEPS=1 (make test) requires" in result.stdout and "pip install 'imgpipe[" in result.stdout


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_rebuilds_the_mxnet_venv_under_a_stale_stamp(tmp_path: Path) -> None:
    """The Makefile's stamp counts only while the venv's python imports mxnet; else the venv is rebuilt."""
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "tools" / "interop-requirements.txt").write_text("")
    venv_python = tmp_path / ".venv-mxnet" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    stamp = tmp_path / ".venv-mxnet" / ".installed"
    make = ["make", "--no-print-directory", "interop-venv", "PYTHON=false"]  # a rebuild would run `false -m venv` and fail

    stamp.touch()  # over a missing interpreter
    rebuilt = subprocess.run(make, cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert rebuilt.returncode != 0 and "false -m venv --clear .venv-mxnet" in rebuilt.stdout and not stamp.exists()

    mxnet = os.environ.get("IMGPIPE_MXNET_PYTHON") or sys.executable
    venv_python.write_text(f'#!/bin/sh\nexec {mxnet} "$@"\n')
    venv_python.chmod(0o755)
    stamp.touch()
    kept = subprocess.run(make, cwd=tmp_path, capture_output=True, text=True, timeout=50)
    imports = subprocess.run([str(venv_python), "-c", "import mxnet"], capture_output=True).returncode == 0
    assert (kept.returncode == 0 and "is up to date" in kept.stdout) == imports, kept.stdout + kept.stderr


EXTENSION_TESTS = [
    "tests/image/test_shrink.py::test_clean_jpeg_is_resized_by_libjpeg_turbo_in_one_call",  # skip() in the test
    "tests/loaders/test_jpeg_region.py::test_reduced_regions_are_pillows_draft_decode",  # skipif(decode_region is None)
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strict", [False, True], ids=["plain-pytest", "make-test"])
def test_tests_of_an_unbuilt_c_extension_fail_under_make_test(tmp_path: Path, strict: bool) -> None:
    """Both extensions made unimportable (as an install without libjpeg-turbo's headers leaves them) by a sitecustomize."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoExtensions:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name in ('imgpipe.image._jpeg_shrink', 'imgpipe.image._jpeg_region'):\n"
        "            raise ImportError(name + ' is not built')\n"
        "sys.meta_path.insert(0, NoExtensions())\n"
    )
    result = run_pytest(EXTENSION_TESTS[:1] + [EXTENSION_TESTS[1] + "[2]"], strict=strict, pythonpath=[tmp_path])
    summary = result.stdout.strip().splitlines()[-1].split(" in ")[0]
    assert summary == ("1 failed, 1 error" if strict else "2 skipped"), result.stdout[-3000:]  # a skipif fails at setup: an error
    assert (result.returncode != 0) == strict
