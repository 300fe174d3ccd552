"""The README's "nothing imports torch or DALI until it is used", in a fresh interpreter.

Opening shards, packing, verifying and staging never load torch or DALI; the torch loader loads
torch but not DALI; the store helper and the cache fill load neither tqdm nor torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import imgpipe

    src, dst, out = (Path(p) for p in sys.argv[1:4])
    heavy = lambda: sorted(m for m in ("torch", "nvidia.dali") if m in sys.modules)
    shards = imgpipe.open_shards(src, split="train")
    shards.read(0), shards.describe(0), shards.labels
    imgpipe.pack(dst / "tree", out, workers=1, progress=False)
    assert imgpipe.verify(out, decode=True, workers=1, progress=False).ok
    assert imgpipe.stage(out, dst / "staged").files > 0
    print("data:", heavy())
    imgpipe.make_torch_loader(src, batch_size=2, image_size=16, workers=0, rank=0, world_size=1)
    print("torch loader:", heavy())
    """
)


@pytest.mark.timeout(120)
def test_opening_packing_and_verifying_never_import_torch_or_dali(packed_dir: Path, tmp_path: Path) -> None:
    from _packs import noisy_jpeg

    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (tmp_path / "tree" / name).mkdir(parents=True)
        (tmp_path / "tree" / name / "x.jpg").write_bytes(noisy_jpeg(rng, 32, 24))
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(packed_dir), str(tmp_path), str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=100)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["data: []", "torch loader: ['torch']"]


@pytest.mark.timeout(60)
def test_the_store_helper_and_the_cache_fill_import_neither_tqdm_nor_torch() -> None:
    """Every process that opens a URL starts a store helper, and a cache fill runs in it: what it
    imports is CPU spent beside the loader's workers (tqdm alone is 0.1 s here)."""
    code = (
        "import sys, imgpipe.storage.store_helper, imgpipe.cache.fill, imgpipe._sys.procs;"
        " print(sorted(m for m in ('tqdm', 'torch') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
