"""imgpipe.image.codec: the no-decode fast path, every repair, resizing, skip reasons and header parsing."""

from __future__ import annotations

import io
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from imgpipe.image.codec import Prepared, prepare_image
from imgpipe.image.jpeg import JpegInfo, inspect_jpeg, jpeg_size


def picture(width: int = 96, height: int = 64, seed: int = 0) -> Image.Image:
    """A smooth, asymmetric RGB picture (a gradient per channel plus a bright corner) with a little grain."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([255 * x / width, 255 * y / height, 128 + 60 * np.sin(x / 9)], axis=-1)
    rgb[: height // 4, : width // 4] = 250
    rgb += rng.normal(0, 2, rgb.shape)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def encode(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def decode(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return image.copy()


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float32)


def assert_rgb_baseline(data: bytes) -> JpegInfo:
    info = inspect_jpeg(data)
    assert info is not None and info.sof == 0xC0 and info.components == 3 and info.precision == 8
    assert info.orientation is None and info.adobe_transform is None and info.ends_with_eoi
    assert decode(data).mode == "RGB"
    return info


def exif_orientation(value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


# ----------------------------------------------------------------------------- fast path


@pytest.mark.parametrize(
    "options",
    [dict(quality=90), dict(quality=75, progressive=True), dict(quality=90, exif=exif_orientation(1)), dict(quality=85, subsampling=0)],
    ids=["baseline", "progressive", "exif-orientation-1", "444"],
)
def test_valid_rgb_jpeg_is_kept_byte_exact(options: dict) -> None:
    data = encode(picture(), **options)
    prepared = prepare_image(data)
    assert prepared.action == "kept" and prepared.reason is None
    assert prepared.data == data


def test_zero_padding_after_eoi_is_kept() -> None:
    data = encode(picture()) + b"\0" * 7
    assert prepare_image(data) == Prepared(data, "kept", None)


def test_bytes_after_eoi_are_cut_off_losslessly() -> None:
    clean = encode(picture())
    prepared = prepare_image(clean + b"trailing garbage")
    assert prepared.action == "repaired" and "16 bytes after the EOI" in prepared.reason
    assert prepared.data == clean


def test_small_image_is_never_upscaled() -> None:
    data = encode(picture(96, 64))
    prepared = prepare_image(data, resize=64)
    assert prepared.action == "kept" and prepared.data == data


# ----------------------------------------------------------------------------- repairs


def test_cmyk_jpeg_is_repaired_to_rgb_with_the_same_colours() -> None:
    original = picture()
    prepared = prepare_image(encode(original.convert("CMYK"), quality=95))
    assert prepared.action == "repaired" and "CMYK JPEG converted to RGB" in prepared.reason
    assert_rgb_baseline(prepared.data)
    assert np.abs(pixels(decode(prepared.data)) - pixels(original)).mean() < 6


def test_grayscale_jpeg_is_repaired_to_three_equal_channels() -> None:
    prepared = prepare_image(encode(picture().convert("L"), quality=95))
    assert prepared.action == "repaired" and prepared.reason == "grayscale JPEG converted to RGB"
    assert_rgb_baseline(prepared.data)
    rgb = pixels(decode(prepared.data))
    assert np.abs(rgb[..., 0] - rgb[..., 1]).max() <= 3 and np.abs(rgb[..., 1] - rgb[..., 2]).max() <= 3


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "GIF", "WEBP"])
def test_other_formats_named_jpeg_are_reencoded(fmt: str) -> None:
    original = picture()
    options = {"lossless": True} if fmt == "WEBP" else {}
    prepared = prepare_image(encode(original, fmt, **options), quality=95)
    assert prepared.action == "repaired" and prepared.reason == f"{fmt} image re-encoded as JPEG"
    assert_rgb_baseline(prepared.data)
    tolerance = 25 if fmt == "GIF" else 4  # GIF is palettised
    assert np.abs(pixels(decode(prepared.data)) - pixels(original)).mean() < tolerance


def test_png_with_alpha_and_16_bit_png_become_rgb() -> None:
    rgba = picture().convert("RGBA")
    rgba.putalpha(128)
    prepared = prepare_image(encode(rgba, "PNG"))
    assert prepared.action == "repaired"
    assert np.abs(pixels(decode(prepared.data)) - pixels(picture())).mean() < 4
    gray16 = Image.fromarray((np.arange(64 * 96, dtype=np.uint16).reshape(64, 96) * 10).astype(np.uint16))
    prepared = prepare_image(encode(gray16, "PNG"))
    assert prepared.action == "repaired"
    out = pixels(decode(prepared.data))[..., 0]
    expected = np.asarray(gray16, np.float32) / 257
    assert np.abs(out - expected).mean() < 3


@pytest.mark.parametrize("orientation", [2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_is_applied_then_dropped(orientation: int) -> None:
    stored = picture(96, 64)
    data = encode(stored, quality=95, exif=exif_orientation(orientation))
    assert inspect_jpeg(data).orientation == orientation
    prepared = prepare_image(data, quality=95)
    assert prepared.action == "repaired" and prepared.reason == f"EXIF orientation {orientation} applied"
    assert_rgb_baseline(prepared.data)
    out = decode(prepared.data)
    assert not out.getexif()
    upright = ImageOps.exif_transpose(decode(data))
    assert out.size == upright.size == ((64, 96) if orientation >= 5 else (96, 64))
    assert np.abs(pixels(out) - pixels(upright)).mean() < 3


def test_orientation_6_pixels_match_the_rotated_original() -> None:
    upright = picture(96, 64)
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # what a camera held sideways stores
    prepared = prepare_image(encode(stored, quality=95, exif=exif_orientation(6)), quality=95)
    out = decode(prepared.data)
    assert out.size == upright.size
    assert np.abs(pixels(out) - pixels(upright)).mean() < 4


def test_big_endian_exif_orientation_is_read() -> None:
    ifd = struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, 8, 0) + struct.pack(">I", 0)
    app1 = b"Exif\0\0" + b"MM\0*" + struct.pack(">I", 8) + ifd
    plain = encode(picture())
    data = plain[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + plain[2:]
    assert inspect_jpeg(data).orientation == 8
    assert prepare_image(data).reason == "EXIF orientation 8 applied"


@pytest.mark.parametrize(
    "app1",
    [b"Exif\0\0MM\0*\xff\xff\xff\xff", b"Exif\0\0II*\0\x08\0\0\0\xff\xff", b"Exif\0\0XX", b"Exif\0\0"],
    ids=["ifd-past-end", "entry-count-too-big", "bad-byte-order", "empty-tiff"],
)
def test_malformed_exif_is_ignored(app1: bytes) -> None:
    plain = encode(picture())
    data = plain[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + plain[2:]
    assert inspect_jpeg(data).orientation is None
    assert prepare_image(data).action == "kept"


def test_rgb_coded_jpeg_is_repaired() -> None:
    data = bytearray(encode(picture()))
    sof = data.index(b"\xff\xc0")
    sos = data.index(b"\xff\xda")
    for i, component in enumerate(b"RGB"):  # component ids R, G, B: libjpeg may skip the YCbCr transform
        data[sof + 10 + 3 * i] = component
        data[sos + 5 + 2 * i] = component  # the scan refers to components by id
    info = inspect_jpeg(bytes(data))
    assert info.component_ids == tuple(b"RGB")
    prepared = prepare_image(bytes(data))
    assert prepared.action == "repaired" and "RGB-coded" in prepared.reason
    assert_rgb_baseline(prepared.data)


# ----------------------------------------------------------------------------- resize


@pytest.mark.parametrize("size", [(800, 600), (600, 800), (300, 290)])
def test_resize_sets_the_shorter_side_and_keeps_the_aspect(size: tuple[int, int]) -> None:
    original = picture(*size)
    prepared = prepare_image(encode(original, quality=95), resize=128, quality=92)
    assert prepared.action == "resized" and prepared.reason is None
    out = decode(prepared.data)
    assert min(out.size) == 128
    assert abs(out.size[0] / out.size[1] - size[0] / size[1]) < 0.01
    assert_rgb_baseline(prepared.data)
    reference = original.resize(out.size, Image.Resampling.BICUBIC)
    assert np.abs(pixels(out) - pixels(reference)).mean() < 4


def test_repair_and_resize_together() -> None:
    prepared = prepare_image(encode(picture(400, 300).convert("CMYK")), resize=100)
    assert prepared.action == "repaired"
    assert prepared.reason == "CMYK JPEG converted to RGB; resized to shorter side 100"
    assert decode(prepared.data).size == (133, 100)


def test_exif_rotation_and_resize_together_keep_the_upright_aspect() -> None:
    prepared = prepare_image(encode(picture(800, 600), exif=exif_orientation(6)), resize=150)
    assert prepared.action == "repaired" and prepared.reason == "EXIF orientation 6 applied; resized to shorter side 150"
    assert decode(prepared.data).size == (150, 200)


def test_reencoding_is_deterministic() -> None:
    for data, resize in [(encode(picture().convert("CMYK")), None), (encode(picture(400, 300)), 100), (encode(picture(), "PNG"), None)]:
        first, second = prepare_image(data, resize=resize), prepare_image(data, resize=resize)
        assert first.data == second.data and first.action == second.action


def test_quality_changes_the_reencoded_bytes() -> None:
    data = encode(picture(), "PNG")
    assert len(prepare_image(data, quality=50).data) < len(prepare_image(data, quality=98).data)


# ----------------------------------------------------------------------------- skips


def test_undecodable_files_are_skipped_with_a_reason() -> None:
    jpeg = encode(picture(200, 150), quality=95)
    png = encode(picture(), "PNG")
    cases = {
        b"": "empty file",
        b"<html>404 Not Found</html>\n": "not an image",
        jpeg[: len(jpeg) // 2]: "truncated JPEG (no EOI marker)",
        jpeg[:-2]: "truncated JPEG (no EOI marker)",
        jpeg[:200]: "truncated JPEG (no EOI marker)",
        jpeg[:4]: "not an image",
    }
    for data, reason in cases.items():
        prepared = prepare_image(data)
        assert (prepared.data, prepared.action, prepared.reason) == (None, "skipped", reason), data[:20]
    truncated_png = prepare_image(png[: len(png) // 2])
    assert truncated_png.action == "skipped" and truncated_png.data is None and truncated_png.reason


def test_truncated_jpeg_padded_with_garbage_is_skipped() -> None:
    jpeg = encode(picture(200, 150), quality=95)
    prepared = prepare_image(jpeg[: len(jpeg) // 2] + b"\0\0junk")
    assert prepared.action == "skipped" and prepared.data is None


# ----------------------------------------------------------------------------- headers


@pytest.mark.parametrize("seed", range(12))
def test_jpeg_size_matches_pillow(seed: int) -> None:
    rng = np.random.default_rng(seed)
    width, height = rng.integers(1, 300, size=2).tolist()
    image = picture(width, height, seed)
    mode, options = [("RGB", {}), ("RGB", {"progressive": True}), ("L", {}), ("CMYK", {})][seed % 4]
    data = encode(image.convert(mode), quality=80, exif=exif_orientation(6), **options)
    assert jpeg_size(data) == decode(data).size == (width, height)
    info = inspect_jpeg(data)
    assert (info.width, info.height, info.orientation) == (width, height, 6)
    assert info.components == {"RGB": 3, "L": 1, "CMYK": 4}[mode]
    assert info.progressive == bool(options)


def test_jpeg_size_rejects_non_jpegs() -> None:
    for data in [b"", b"\xff", b"\xff\xd8", b"\xff\xd8\xff\xd9", encode(picture(), "PNG"), b"\xff\xd8\xff\xc0\x00\x11"]:
        assert jpeg_size(data) is None
        assert inspect_jpeg(data) is None


_SEED_JPEG = encode(picture(48, 32), quality=70, exif=exif_orientation(3))


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_header_parsers_survive_random_bytes(data: bytes) -> None:
    for blob in (data, b"\xff\xd8" + data):
        size = jpeg_size(blob)
        assert size is None or (size[0] > 0 and size[1] > 0)
        assert jpeg_size(memoryview(blob)) == size  # the loaders read payloads as views
        info = inspect_jpeg(blob)
        assert info is None or (info.width > 0 and info.height > 0)


@pytest.mark.timeout(120)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, len(_SEED_JPEG) - 1), st.integers(0, 255)), min_size=1, max_size=6), st.integers(0, len(_SEED_JPEG))
)
def test_mutated_jpegs_never_crash(edits: list[tuple[int, int]], cut: int) -> None:
    mutated = bytearray(_SEED_JPEG)
    for position, value in edits:
        mutated[position] = value
    data = bytes(mutated[:cut])
    size = jpeg_size(data)
    assert size is None or min(size) > 0
    inspect_jpeg(data)
    prepared = prepare_image(data)
    assert prepared.action in ("kept", "repaired", "skipped")
    assert (prepared.data is None) == (prepared.action == "skipped")
    if prepared.action == "repaired":
        assert_rgb_baseline(prepared.data)


# ----------------------------------------------------------------------------- backends agree


def _quirk_sources() -> dict[str, bytes]:
    upright = picture(96, 64)
    return {
        "cmyk": encode(upright.convert("CMYK"), quality=95),
        "grayscale": encode(upright.convert("L"), quality=95),
        "png": encode(upright, "PNG"),
        "exif6": encode(upright.transpose(Image.Transpose.ROTATE_90), quality=95, exif=exif_orientation(6)),
        "kept": encode(upright, quality=90),
    }


OPENCV_SCRIPT = """
import sys, pathlib, numpy as np, cv2
for path in sys.argv[1:]:
    image = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR)  # what im2rec and mx.image do
    np.save(path + ".npy", image[:, :, ::-1])
"""


@pytest.mark.interop
@pytest.mark.timeout(120)
def test_opencv_and_pillow_see_the_same_pixels_after_repair(tmp_path: Path, mxnet_python: str) -> None:
    paths = []
    for name, data in _quirk_sources().items():
        prepared = prepare_image(data)
        assert prepared.action == ("kept" if name == "kept" else "repaired")
        (tmp_path / f"{name}.src").write_bytes(data)
        (tmp_path / f"{name}.out").write_bytes(prepared.data)
        paths += [tmp_path / f"{name}.src", tmp_path / f"{name}.out"]
    subprocess.run([mxnet_python, "-c", OPENCV_SCRIPT, *map(str, paths)], check=True, timeout=100)
    for name in _quirk_sources():
        repaired = (tmp_path / f"{name}.out").read_bytes()
        opencv = np.load(tmp_path / f"{name}.out.npy").astype(np.float32)
        assert opencv.shape[:2] == decode(repaired).size[::-1] == (64, 96), name
        assert np.abs(opencv - pixels(decode(repaired))).mean() < 1.5, name
    # Why orientation is applied at pack time: OpenCV turns the original, Pillow (and DALI's loader) do not.
    assert np.load(tmp_path / "exif6.src.npy").shape[:2] == (64, 96) != decode(_quirk_sources()["exif6"]).size[::-1]


@pytest.mark.dali
@pytest.mark.timeout(120)
def test_dali_cpu_decoder_sees_the_same_pixels_after_repair(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types

    names = list(_quirk_sources())
    files = []
    for name in names:
        files.append(str(tmp_path / f"{name}.jpg"))
        Path(files[-1]).write_bytes(prepare_image(_quirk_sources()[name]).data)

    @pipeline_def(batch_size=len(files), num_threads=1, device_id=None)
    def decode_all():
        jpegs, _ = fn.readers.file(files=files, random_shuffle=False)
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)

    pipe = decode_all()
    pipe.build()
    (batch,) = pipe.run()
    for i, name in enumerate(names):
        dali = np.asarray(batch.at(i), dtype=np.float32)
        assert dali.shape == (64, 96, 3), name
        assert np.abs(dali - pixels(decode(Path(files[i]).read_bytes()))).mean() < 1.5, name
