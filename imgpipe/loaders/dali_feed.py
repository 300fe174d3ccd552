"""What imgpipe hands DALI's external source per batch: each record's bytes, the window to decode, the crop and flip.

Per sample, for the sampler's records and the torch loader's boxes (``geometry.sample_crop``):
``anchor`` / ``shape``, the smallest whole-pixel window holding the box, for ``decoders.image_slice``;
``roi_start`` / ``roi_end``, the (possibly fractional) box inside it, for ``fn.resize``; ``mirror``; and
``size``, the epoch's output size, so the pipeline follows ``set_resolution``. Labels stay on the host.
Batches are prepared ``READ_AHEAD`` ahead in a thread of its own (docs/measurements.md says why).
Pure numpy: no DALI import, so it runs (and is tested) anywhere.
"""

from __future__ import annotations

import io
import math
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from imgpipe.errors import DatasetError
from imgpipe.format.shardset import ShardSet
from imgpipe.image.codec import decode_failure
from imgpipe.image.jpeg import jpeg_size
from imgpipe.loaders.geometry import Crop, EvalGeometry, TrainGeometry, sample_crop

UNDECODABLE_FIX = "run 'imgpipe verify --decode' on the folder, or use the torch loader with on_corrupt='skip'"
FEED_NAMES = ("jpegs", "anchor", "shape", "roi_start", "roi_end", "mirror", "size")
READ_AHEAD = 2  # batches prepared ahead of DALI's calls


WINDOW_DTYPES = (np.int32, np.int32, np.float32, np.float32, np.int32)


class Window(NamedTuple):
    """One sample's decode window and crop, as the pipeline's inputs take them."""

    anchor: tuple[int, int]  # (x, y)
    shape: tuple[int, int]  # (w, h)
    roi_start: tuple[float, float]  # (y, x), inside the window
    roi_end: tuple[float, float]  # (y, x)
    mirror: int  # 0 or 1


def stored_size(payload: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from the JPEG header, else Pillow's header read (PNG and others); None when neither reads it."""
    size = jpeg_size(payload)
    if size is not None:
        return size
    try:
        with Image.open(io.BytesIO(payload)) as image:
            return image.size
    except (OSError, ValueError, SyntaxError):
        return None


def window_of(crop: Crop, width: int, height: int) -> Window:
    """The whole-pixel window around ``crop`` in a ``width`` x ``height`` image, and the box inside it."""
    x0, y0 = max(0, math.floor(crop.left)), max(0, math.floor(crop.top))
    x1 = min(width, max(x0 + 1, math.ceil(crop.left + crop.width)))
    y1 = min(height, max(y0 + 1, math.ceil(crop.top + crop.height)))
    return Window(
        (x0, y0),
        (x1 - x0, y1 - y0),
        (crop.top - y0, crop.left - x0),
        (crop.top + crop.height - y0, crop.left + crop.width - x0),
        int(crop.flip),
    )


class DaliFeed:
    """The external source's callable: each call is the next batch of (epoch, record indices) given to
    ``start``, as ``FEED_NAMES`` lists, prepared ahead in a thread. ``StopIteration`` after the last
    ends DALI's epoch; a batch's error (a record without an image header) is raised by its call.
    """

    def __init__(self, shards: ShardSet, geometry: TrainGeometry | EvalGeometry, seed: int) -> None:
        self.shards = shards
        self.geometry = geometry
        self.seed = seed
        self.queue: deque[tuple[int, np.ndarray]] = deque()  # batches not yet being prepared
        self.size = geometry.image_size  # the output size of the batches started last
        self.fed: deque[np.ndarray] = deque()  # the batches handed to DALI and not yet out of it, oldest first
        self._ahead: deque[tuple[np.ndarray, Future]] = deque()  # batches being prepared, in order
        self._thread: ThreadPoolExecutor | None = None

    def start(self, epoch: int, batches: list[np.ndarray], size: int | None = None) -> None:
        """Feed these batches of ``epoch`` next, at ``size`` (default: the geometry's); anything queued or
        prepared before is dropped."""
        for _, prepared in self._ahead:
            prepared.cancel()
        self._ahead.clear()
        self.fed.clear()
        self.queue = deque((epoch, batch) for batch in batches)
        self.size = self.geometry.image_size if size is None else size
        self._prepare_ahead()

    def close(self) -> None:
        """Stop the read-ahead thread (a later ``start`` makes a new one)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
            self._thread = None

    def __call__(self) -> tuple[Any, ...]:
        if not self._ahead:  # ``start`` prepared the first, and every call the next
            raise StopIteration
        indices, prepared = self._ahead.popleft()
        self.fed.append(indices)
        self._prepare_ahead()
        return prepared.result()

    def _prepare_ahead(self) -> None:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="imgpipe-dali-feed")
        while self.queue and len(self._ahead) < READ_AHEAD:
            epoch, indices = self.queue.popleft()
            following = self.queue[0][1] if self.queue else None
            self._ahead.append((indices, self._thread.submit(self.batch, epoch, indices, following, self.size)))

    def batch(self, epoch: int, indices: np.ndarray, following: np.ndarray | None = None, size: int | None = None) -> tuple[Any, ...]:
        """The inputs of one batch: the records' bytes (a list), then one array per window field and the
        output size (first axis: samples).

        The records are fetched together (one batched request from a URL, with ``following``, the
        next batch's records, fetched meanwhile)."""
        geometry = self.geometry if size is None else self.geometry.at(size)
        payloads: list[np.ndarray] = []
        windows: list[Window] = []
        records = self.shards.fetch(indices, () if following is None else (following,))
        for k, index in enumerate(indices.tolist()):
            _, payload = records.read_view(k)
            stored = stored_size(payload)
            if stored is None:
                reason = decode_failure(payload) or "no readable image header"
                raise DatasetError(f"cannot decode {self.shards.describe(index)}: {reason}; {UNDECODABLE_FIX}")
            crop = sample_crop(geometry, stored[0], stored[1], seed=self.seed, epoch=epoch, index=index)
            payloads.append(np.frombuffer(payload, np.uint8))
            windows.append(window_of(crop, *stored))
        fields = zip(*windows)
        sizes = np.full((len(windows), 2), geometry.image_size, np.float32)
        return (payloads, *(np.array(column, dtype) for column, dtype in zip(fields, WINDOW_DTYPES)), sizes)
