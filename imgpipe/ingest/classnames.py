"""Class names for sources that label by index only (a WebDataset ``.cls``, a Parquet ``label``).

ILSVRC2012's publishers number its 1,000 classes in sorted-wnid order (the Hugging Face
loading script's ``classes.py``, TFDS and so timm's WebDataset copies): index k is the k-th
of the sorted wnids in ``ilsvrc2012_wnids.txt``. A source holding exactly those 1,000
indices gets them as wnids; any other set of indices is named by index, zero-padded so that
sorting the names (as ImageFolder sorts class folders) keeps the numeric order.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Iterable

ILSVRC2012_CLASSES = 1000


@functools.cache
def ilsvrc2012_wnids() -> tuple[str, ...]:
    """The 1,000 ILSVRC2012 wnids, sorted: position k is class index k."""
    text = resources.files("imgpipe.ingest").joinpath("ilsvrc2012_wnids.txt").read_text(encoding="ascii")
    return tuple(text.split())


def names_for_indices(indices: Iterable[int]) -> dict[int, str]:
    """Index -> class name: the ILSVRC2012 wnid when ``indices`` are exactly 0..999, else the zero-padded index."""
    found = sorted(set(indices))
    if found == list(range(ILSVRC2012_CLASSES)):
        return dict(enumerate(ilsvrc2012_wnids()))
    width = len(str(found[-1])) if found else 1
    return {index: f"{index:0{width}d}" for index in found}
