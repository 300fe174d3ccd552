"""pack --resize: the libjpeg-turbo path (imgpipe.image.shrink) and Pillow's path give antialiased, deterministic output.

Every test that matters for both runs in both modes: with the C extension, and with it
hidden as on an installation built without a compiler (``shrink._shrink = None``; pack's
workers are forked, so they inherit the patch).
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgpipe.image import shrink
from imgpipe.image.codec import prepare_image
from imgpipe.packing.packer import pack

sys.path.insert(0, str(Path(__file__).parent))
from test_codec import OPENCV_SCRIPT  # noqa: E402

RESIZE = 256


@pytest.fixture(params=["libjpeg-turbo", "pillow"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "pillow":
        monkeypatch.setattr(shrink, "_shrink", None)
    elif not shrink.available():
        pytest.skip("imgpipe.image._jpeg_shrink is not built")
    return request.param


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth photo-like picture (colour waves, a 20-40 px texture, faint grain) with a band of fine
    stripes (a 3-pixel period) that a resize without antialiasing turns into moire. The grain is
    faint so that the quality-95 re-encode alone stays well under the test's bound."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32) / max(width, height)
    phase = rng.uniform(0, 2 * np.pi, 3)
    rgb = np.stack([128 + 80 * np.sin(6 * x + 4 * y + p) for p in phase], axis=-1)
    rgb += 30 * np.sin(90 * x * np.cos(phase[0]) + 60 * y)[..., None]
    rgb += rng.normal(0, 1, rgb.shape)
    rgb[height // 3 : height // 2] = np.where((np.arange(width) % 3 == 0)[None, :, None], 170, 90)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def jpeg(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def decoded(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.float32)


SOURCES = {
    "500x375 4:2:0": lambda: jpeg(photo(500, 375), quality=92),
    "375x500 progressive": lambda: jpeg(photo(375, 500, 1), quality=90, progressive=True),
    "500x333 4:4:4": lambda: jpeg(photo(500, 333, 2), quality=95, subsampling=0),
    "2200x1650 large": lambda: jpeg(photo(2200, 1650, 3), quality=90),
    "grayscale": lambda: jpeg(photo(500, 375, 4).convert("L"), quality=92),
    "cmyk": lambda: jpeg(photo(500, 375, 5).convert("CMYK"), quality=95),
}


@pytest.mark.parametrize("name", SOURCES)
def test_resized_output_is_antialiased_like_pillows_full_decode_and_resize(name: str, mode: str) -> None:
    data = SOURCES[name]()
    prepared = prepare_image(data, resize=RESIZE, quality=95)
    assert prepared.action in ("resized", "repaired")
    with Image.open(io.BytesIO(data)) as source:
        size = source.size
        reference = source.convert("RGB").resize(shrink_target(size), Image.Resampling.BILINEAR)
    got = decoded(prepared.data)
    assert got.shape == (reference.height, reference.width, 3)
    per_channel = np.abs(got - np.asarray(reference, dtype=np.float32)).mean(axis=(0, 1))
    assert per_channel.max() <= 1.5, per_channel


def shrink_target(size: tuple[int, int]) -> tuple[int, int]:
    return _target(size, RESIZE)


def _target(size: tuple[int, int], short: int) -> tuple[int, int]:
    width, height = size
    return (short, round(height * short / width)) if width <= height else (round(width * short / height), short)


def test_clean_jpeg_is_resized_by_libjpeg_turbo_in_one_call() -> None:
    if not shrink.available():
        pytest.skip("imgpipe.image._jpeg_shrink is not built")
    data = jpeg(photo(500, 375), quality=92)
    prepared = prepare_image(data, resize=RESIZE, quality=90)
    assert prepared.action == "resized" and prepared.reason is None
    assert prepared.data == shrink._shrink(data, 8, 341, 256, 90)


@pytest.mark.parametrize("size", [(500, 375), (999, 700), (1100, 800), (2200, 1650), (4000, 300), (300, 2100), (6000, 4500)])
def test_dct_reduction_is_pillows_draft(size: tuple[int, int]) -> None:
    target = shrink_target(size)
    with Image.open(io.BytesIO(jpeg(Image.new("RGB", size)))) as image:
        image.draft("RGB", shrink.draft_size(target))
        drafted = image.size
    reduction = shrink.dct_reduction(size, target)
    assert drafted == (-(-size[0] // reduction), -(-size[1] // reduction))


def test_corrupt_data_falls_back_to_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    clean = jpeg(photo(500, 375), quality=92)
    data = clean[: len(clean) // 2] + b"\xff\xd4" + clean[len(clean) // 2 :]  # a stray RST4: libjpeg warns
    assert shrink.shrink_jpeg(data, (500, 375), (341, 256), 95) is None
    through_c = prepare_image(data, resize=RESIZE)
    monkeypatch.setattr(shrink, "_shrink", None)
    assert through_c == prepare_image(data, resize=RESIZE) and through_c.action == "resized"


def test_decompression_bomb_limit_holds_for_the_c_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50_000)  # Pillow refuses above twice the limit
    prepared = prepare_image(jpeg(photo(500, 375)), resize=RESIZE)
    assert prepared.data is None and prepared.reason.startswith("image too large to decode safely")


@pytest.mark.timeout(120)
def test_resized_pack_does_not_depend_on_workers_or_runs(tmp_path: Path, mode: str) -> None:
    src = tmp_path / "src" / "train"
    for k in range(12):
        folder = src / f"n{k % 3:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        image = photo(500 + 40 * k, 375, seed=k)
        (folder / f"{k}.JPEG").write_bytes(jpeg(image.convert("L") if k == 5 else image, quality=90))
    outputs = []
    for name, workers in (("a", 1), ("b", 2), ("c", 2)):
        pack(tmp_path / "src", tmp_path / name, resize=RESIZE, shards=3, workers=workers, progress=False)
        outputs.append({p.name: p.read_bytes() for p in sorted((tmp_path / name).glob("*.rec"))})
    assert len(outputs[0]) == 3 and outputs[0] == outputs[1] == outputs[2]


@pytest.mark.parametrize("size", [(501, 377), (333, 499), (260, 259), (1001, 667), (17, 900)])
def test_sizes_that_are_not_whole_mcus(size: tuple[int, int], mode: str) -> None:
    """Odd sizes, in and out, that end inside a 16-pixel MCU: the planes line up, and the last rows and columns are right."""
    data = jpeg(photo(*size, seed=sum(size)), quality=92)
    short = min(size) - 3
    prepared = prepare_image(data, resize=short, quality=95)
    with Image.open(io.BytesIO(data)) as source:
        target = _target(source.size, short)
        reference = np.asarray(source.convert("RGB").resize(target, Image.Resampling.BILINEAR), dtype=np.float32)
    got = decoded(prepared.data)
    assert got.shape == reference.shape
    edges = np.concatenate([np.abs(got - reference)[:, -2:].reshape(-1, 3), np.abs(got - reference)[-2:].reshape(-1, 3)])
    assert np.abs(got - reference).mean(axis=(0, 1)).max() <= 1.5 and edges.mean(axis=0).max() <= 3


@pytest.mark.interop
@pytest.mark.timeout(120)
def test_opencv_reads_the_resized_jpegs_as_pillow_does(tmp_path: Path, mxnet_python: str, mode: str) -> None:
    """MXNet's side (OpenCV's imdecode, as im2rec and mx.image) sees the pixels the Pillow-based loaders see."""
    paths = []
    for name in ("500x375 4:2:0", "500x333 4:4:4", "2200x1650 large"):
        path = tmp_path / f"{name.replace(' ', '_').replace(':', '')}.jpg"
        path.write_bytes(prepare_image(SOURCES[name](), resize=RESIZE).data)
        paths.append(path)
    subprocess.run([mxnet_python, "-c", OPENCV_SCRIPT, *map(str, paths)], check=True, timeout=100)
    for path in paths:
        assert np.array_equal(np.load(f"{path}.npy"), decoded(path.read_bytes()).astype(np.uint8)), path.name


def three_photos(src: Path) -> None:
    (src / "cls").mkdir(parents=True)
    for k in range(3):
        photo(400, 300, seed=k).save(src / "cls" / f"{k}.JPEG", quality=95)


def test_a_resized_pack_is_never_resumed_with_the_other_resizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C path and Pillow's give other bytes, so the resizer is one of the pack's options: a DST
    packed with one (say on a node with a compiler) is refused to the other, never mixed."""
    from imgpipe.errors import PackError

    if not shrink.available():
        pytest.skip("imgpipe.image._jpeg_shrink is not built")
    three_photos(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "dst", resize=128, workers=1, progress=False)
    monkeypatch.setattr(shrink, "_shrink", None)
    with pytest.raises(PackError, match="resizer"):
        pack(tmp_path / "src", tmp_path / "dst", resize=128, workers=1, progress=False)


WITHOUT_SHRINKER = "import sys; sys.modules['imgpipe.image._jpeg_shrink'] = None; from imgpipe.cli import main; main()"


def imgpipe(*args: object, shrinker: bool) -> subprocess.CompletedProcess[str]:
    """The real CLI, in an installation with the C shrinker, or as one built without a compiler (its import fails)."""
    command = [sys.executable, "-m", "imgpipe"] if shrinker else [sys.executable, "-c", WITHOUT_SHRINKER]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(180)
def test_info_and_verify_name_the_resizer_and_whether_this_installation_resizes_alike(tmp_path: Path) -> None:
    """The two resizers give other bytes (a pack records which one made them): info and verify say which, in one line,
    and whether a pack made by this installation would have the same bytes."""
    if not shrink.available():
        pytest.skip("imgpipe.image._jpeg_shrink is not built")
    three_photos(tmp_path / "src")
    packs = {}
    for name, shrinker in (("libjpeg-turbo", True), ("pillow", False)):
        packed = imgpipe("pack", tmp_path / "src", tmp_path / name, "--resize", "128", "--workers", "1", shrinker=shrinker)
        assert packed.returncode == 0, packed.stderr
        packs[name] = b"".join(p.read_bytes() for p in sorted((tmp_path / name).glob("*.rec")))
    assert packs["libjpeg-turbo"] != packs["pillow"]
    for made in packs:
        for shrinker, here in ((True, "libjpeg-turbo"), (False, "pillow")):
            alike = " too" if here == made else ": a pack made here would have other bytes"
            line = f"resized: shorter side 128 px by {made}; this installation resizes with {here}{alike}"
            info, verify = imgpipe("info", tmp_path / made, shrinker=shrinker), imgpipe("verify", tmp_path / made, shrinker=shrinker)
            assert info.returncode == 0 and info.stdout.splitlines().count(line) == 1, info.stdout
            assert verify.returncode == 0 and verify.stdout.splitlines().count(line) == 1, verify.stdout
    kept = imgpipe("pack", tmp_path / "src", tmp_path / "kept", "--workers", "1", shrinker=True)
    assert kept.returncode == 0 and "resized:" not in imgpipe("info", tmp_path / "kept", shrinker=True).stdout
