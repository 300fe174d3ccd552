"""The region decoder (``imgpipe/image/_jpeg_region.c``) against whole decodes of real JPEGs."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imgpipe.image import codec, shrink
from imgpipe.loaders import pixels
from imgpipe.loaders.torch import make_torch_loader

HEADER_DIRS = ["/usr/include", "/usr/local/include"] + ([os.environ["CONDA_PREFIX"] + "/include"] if "CONDA_PREFIX" in os.environ else [])


def test_the_c_extensions_are_built_where_libjpeg_turbo_headers_are() -> None:
    # the build is optional (setup.py) so an install without headers still works; where they are,
    # as on CI, a silently failed build would quietly fall back to whole-image decodes and Pillow's checks
    if not any(Path(d, "jpeglib.h").is_file() for d in HEADER_DIRS):
        pytest.skip("no jpeglib.h: the C extensions are not expected to build here")
    assert pixels.region_decoder() is not None
    assert shrink.available() and codec.scan_check_built()


decode_region = pixels.region_decoder()
# the tests below need the decoder; the build check above must run without it, so no module-level pytestmark
needs_decoder = pytest.mark.skipif(decode_region is None, reason="the region decoder was not built (no libjpeg-turbo headers)")


def _jpeg(width: int, height: int, *, mode: str = "RGB", seed: int = 0, **save: object) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x * y) % 256], axis=-1)
    rgb = np.clip(smooth + rng.integers(0, 60, size=(height, width, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).convert(mode).save(out, "JPEG", quality=90, **save)
    return out.getvalue()


def _region(payload: bytes, left: int, top: int, width: int, height: int, reduction: int = 1) -> np.ndarray:
    return np.frombuffer(decode_region(payload, left, top, width, height, reduction), np.uint8).reshape(height, width, 3)


def _whole(payload: bytes, reduction: int = 1) -> np.ndarray:
    width, height = (-(-side // reduction) for side in Image.open(io.BytesIO(payload)).size)
    return _region(payload, 0, 0, width, height, reduction)


JPEG_KINDS = {
    "4:2:0": dict(subsampling=2),
    "4:2:2": dict(subsampling=1),
    "4:4:4": dict(subsampling=0),
    "grayscale": dict(mode="L"),
    "progressive": dict(progressive=True),
    "restart markers": dict(restart_marker_blocks=3),
}


@needs_decoder
@pytest.mark.parametrize("kind", JPEG_KINDS)
def test_every_region_holds_exactly_the_pixels_of_a_whole_decode(kind: str) -> None:
    payload = _jpeg(173, 131, **JPEG_KINDS[kind])
    whole = _whole(payload)
    reference = np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))
    assert np.abs(whole.astype(int) - reference).max() <= 1  # the same library as Pillow's, maybe another version
    rng = np.random.default_rng(1)
    boxes = [(0, 0, 173, 131), (0, 0, 1, 1), (172, 130, 1, 1), (15, 15, 2, 2), (16, 16, 17, 33), (1, 0, 172, 131)]
    boxes += [(int(x), int(y), int(rng.integers(1, 174 - x)), int(rng.integers(1, 132 - y))) for x, y in rng.integers(0, 130, size=(40, 2))]
    for left, top, width, height in boxes:
        region = _region(payload, left, top, width, height)
        assert np.array_equal(region, whole[top : top + height, left : left + width]), (left, top, width, height)


@needs_decoder
@pytest.mark.parametrize("reduction", [2, 4, 8])
def test_reduced_regions_are_pillows_draft_decode(reduction: int) -> None:
    payload = _jpeg(389, 277, seed=reduction)
    image = Image.open(io.BytesIO(payload))
    image.draft("RGB", (389 // reduction, 277 // reduction))
    drafted = np.asarray(image.convert("RGB"))
    whole = _whole(payload, reduction)
    assert whole.shape == drafted.shape and np.abs(whole.astype(int) - drafted).max() <= 1
    height, width = whole.shape[:2]
    for left, top in ((0, 0), (width // 3, height // 2), (width - 9, height - 7)):
        region = _region(payload, left, top, 9, 7, reduction)
        assert np.array_equal(region, whole[top : top + 7, left : left + 9])


@needs_decoder
@pytest.mark.parametrize(
    "call, message",
    [
        ((60, 0, 20, 10, 1), "region 20x10 at \\(60, 0\\) is not inside the 70x50 image"),
        ((0, 0, 0, 10, 1), "is not inside"),
        ((-1, 0, 5, 5, 1), "is not inside"),
        ((0, 0, 36, 25, 2), "is not inside the 35x25 image"),
        ((0, 0, 5, 5, 3), "reduction must be 1, 2, 4 or 8"),
    ],
)
def test_a_region_outside_the_image_is_refused_before_decoding(call: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_region(_jpeg(70, 50), *call)


@needs_decoder
def test_libjpeg_errors_and_warnings_raise_with_libjpegs_message() -> None:
    payload = _jpeg(70, 50)
    with pytest.raises(ValueError, match="Premature end of JPEG file"):  # a warning: libjpeg would fill gray
        decode_region(payload[: len(payload) // 2], 0, 0, 70, 50, 1)
    with pytest.raises(ValueError, match="Not a JPEG file"):
        decode_region(b"GIF89a" + bytes(40), 0, 0, 1, 1, 1)
    with pytest.raises(ValueError, match="color conversion"):  # CMYK: Pillow decodes it instead
        decode_region(_jpeg(70, 50, mode="CMYK"), 0, 0, 70, 50, 1)


@needs_decoder
def test_damaged_jpegs_raise_value_error_or_decode_never_crash() -> None:
    # C code parsing untrusted bytes: every damaged input either decodes to the asked size or
    # raises ValueError (a crash would take the test run down with it)
    rng = np.random.default_rng(7)
    originals = [_jpeg(64, 48, **JPEG_KINDS[kind]) for kind in ("4:2:0", "progressive", "restart markers")]
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(400):
        payload = bytearray(originals[int(rng.integers(len(originals)))])
        if rng.random() < 0.5:
            for at in rng.integers(0, len(payload), size=int(rng.integers(1, 8))):
                payload[at] = int(rng.integers(256))
        else:
            del payload[int(rng.integers(2, len(payload))) :]
        reduction = int(rng.choice([1, 2, 4, 8]))
        image_width, image_height = 64 // reduction, 48 // reduction
        left, top = int(rng.integers(0, image_width)), int(rng.integers(0, image_height))
        width, height = int(rng.integers(1, image_width - left + 1)), int(rng.integers(1, image_height - top + 1))
        try:
            out = decode_region(bytes(payload), left, top, width, height, reduction)
        except ValueError:
            outcomes["refused"] += 1
        else:
            assert len(out) == width * height * 3
            outcomes["decoded"] += 1
    assert outcomes["decoded"] > 20 and outcomes["refused"] > 100


@needs_decoder
def test_the_loader_yields_the_same_batches_with_and_without_the_region_decoder(packed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def batches() -> list[torch.Tensor]:
        loader = make_torch_loader(packed_dir, batch_size=8, image_size=48, workers=0, normalize=False, rank=0, world_size=1, seed=5)
        return [images for images, _ in loader]

    regions = batches()
    monkeypatch.setattr(pixels, "region_decoder", lambda: None)
    wholes = batches()
    assert len(regions) == len(wholes) == 6
    # boxes that shrink 2x or more are resized by Pillow from a region instead of a whole draft
    # decode: its filter weights then differ in the last bit, so a pixel may round the other way
    for ours, theirs in zip(regions, wholes):
        assert (ours.int() - theirs.int()).abs().max() <= 1
    assert sum(torch.equal(a, b) for a, b in zip(torch.cat(regions), torch.cat(wholes))) >= 24


@needs_decoder
def test_a_record_damaged_only_below_its_crop_decodes_as_the_intact_one() -> None:
    """The README's one difference: the region decoder never reads the rows below the box, so a JPEG
    cut short below it gives the intact crop without error, while a box over the damage fails and
    ``imgpipe verify --decode`` (a whole decode) reports the record."""
    from imgpipe.image.codec import decode_failure
    from imgpipe.loaders.geometry import Crop

    y, x = np.mgrid[0:256, 0:192]
    image = np.stack([(x + y) % 256, (2 * x) % 256, (3 * y) % 256], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "JPEG", quality=90)
    intact = buf.getvalue()
    damaged = intact[: int(len(intact) * 0.6)]  # the scan stops a little past the middle rows
    top = Crop(16, 8, 96, 64)
    assert torch.equal(pixels.decode_sample(damaged, lambda w, h: top, 32), pixels.decode_sample(intact, lambda w, h: top, 32))
    with pytest.raises(pixels.UndecodableImage, match="truncated"):
        pixels.decode_sample(damaged, lambda w, h: Crop(16, 200, 96, 50), 32)
    assert decode_failure(damaged) == "truncated JPEG" and decode_failure(intact) is None
