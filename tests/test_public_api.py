"""The public names of ``import imgpipe`` are the documented functions, whatever was imported before them."""

from __future__ import annotations

import subprocess
import sys

import pytest

import imgpipe


@pytest.mark.parametrize(
    "first", ["", "import imgpipe.packing.packer, imgpipe.format.verify, imgpipe.staging.stager, imgpipe.cache.opening; "]
)
def test_every_public_name_is_the_documented_callable_even_after_its_modules_are_imported(first: str) -> None:
    code = f"{first}import imgpipe; print(sorted(n for n in imgpipe.__all__ if not callable(getattr(imgpipe, n))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_pack_and_verify_are_functions() -> None:
    assert imgpipe.pack.__module__ == "imgpipe.packing.packer" and imgpipe.verify.__module__ == "imgpipe.format.verify"
