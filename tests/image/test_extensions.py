"""The region decoder never goes missing in silence: the first torch loader of a process warns once, naming the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgpipe.image.extensions import region_decoder_problem

# two loaders in one process, then one batch of the second (decoded whole, without the extension)
TWO_LOADERS = (
    "import sys, imgpipe\n"
    "first = imgpipe.make_torch_loader(sys.argv[1], 'train', batch_size=4, image_size=32, workers=0, device=None)\n"
    "second = imgpipe.make_torch_loader(sys.argv[1], 'val', batch_size=4, train=False, image_size=32, workers=0, device=None)\n"
    "images, labels = next(iter(second))\n"
    "print(tuple(images.shape))\n"
)
# a sitecustomize that makes the extension fail to import as it does when its libjpeg is missing
NO_REGION_DECODER = (
    "import sys\n"
    "class NoRegionDecoder:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'imgpipe.image._jpeg_region':\n"
    "            raise ImportError('libjpeg.so.62: cannot open shared object file: No such file or directory')\n"
    "sys.meta_path.insert(0, NoRegionDecoder())\n"
)
WARNING = "imgpipe's region decoder (imgpipe.image._jpeg_region) cannot be imported"


def two_loaders(packed_dir: Path, pythonpath: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    run = subprocess.run([sys.executable, "-c", TWO_LOADERS, str(packed_dir)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "(4, 3, 32, 32)"
    return run


def test_the_first_loader_without_the_region_decoder_warns_once_naming_the_fix(packed_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(NO_REGION_DECODER)
    stderr = two_loaders(packed_dir, tmp_path).stderr
    assert stderr.count(WARNING) == 1, stderr[-3000:]
    warning = next(line for line in stderr.splitlines() if WARNING in line)
    assert "libjpeg.so.62: cannot open shared object file" in warning  # why it cannot be imported
    assert "manylinux wheel" in warning and "libjpeg62-turbo-dev" in warning and "libjpeg-turbo-devel" in warning


def test_a_loader_with_the_region_decoder_does_not_warn(packed_dir: Path) -> None:
    if region_decoder_problem() is not None:
        pytest.skip(f"the region decoder was not built here: {region_decoder_problem()}")
    stderr = two_loaders(packed_dir, None).stderr
    assert WARNING not in stderr, stderr[-3000:]
