"""The keep path's check (``codec.keep_failure``) against Pillow's whole decode, which it replaces.

The files: a zoo of encodings and damage, and 200 seeded random corruptions of the scans of
ImageNet-like JPEGs (``jpeg_zoo``). Pillow's decode is what ``imgpipe verify --decode`` runs, and
the loaders fall back to it, so a JPEG pack keeps must pass it.
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from imgpipe.image import codec
from imgpipe.image.codec import decode_failure, keep_failure, prepare_image
from imgpipe.image.jpeg import inspect_jpeg
from imgpipe.packing.packer import pack

sys.path.insert(0, str(Path(__file__).parent))
import jpeg_zoo  # noqa: E402

needs_extension = pytest.mark.skipif(codec._scan_problem is None, reason="imgpipe.image._jpeg_shrink is not built")


@pytest.fixture(scope="module")
def corruptions() -> dict[str, bytes]:
    return jpeg_zoo.scan_corruptions(jpeg_zoo.scan_corruption_sources())


@pytest.fixture(scope="module")
def files(corruptions: dict[str, bytes]) -> dict[str, bytes]:
    """Every test file within Pillow's pixel limit (pack skips larger ones before any check)."""
    every = {**jpeg_zoo.encodings(), **jpeg_zoo.damaged(), **jpeg_zoo.scan_corruption_sources(), **corruptions}
    with_size = {name: (data, inspect_jpeg(data)) for name, data in every.items()}
    return {name: data for name, (data, info) in with_size.items() if info is None or not codec._too_large(info.width, info.height)}


@needs_extension
@pytest.mark.timeout(120)
def test_the_check_passes_no_jpeg_that_pillows_decode_refuses(
    files: dict[str, bytes], corruptions: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = {name for name, data in files.items() if decode_failure(data) is not None}
    decoded: list[bytes] = []

    def recorded(data: bytes) -> str | None:
        decoded.append(data)
        return decode_failure(data)

    monkeypatch.setattr(codec, "decode_failure", recorded)
    passed = set()
    for name, data in files.items():
        decoded.clear()
        if keep_failure(data) is None and not decoded:
            passed.add(name)
    assert not passed & refused, sorted(passed & refused)
    assert len(refused & corruptions.keys()) >= 20, "too few corruptions that Pillow refuses for this test to mean anything"
    # And the other way round: the check sends no JPEG that Pillow decodes to Pillow's decode (the speed).
    assert passed == files.keys() - refused, sorted(files.keys() - refused - passed)


@needs_extension
@pytest.mark.timeout(120)
def test_keep_failure_gives_decode_failures_outcome_and_reason(files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert keep_failure(data) == decode_failure(data), name


_SEEDS = (
    jpeg_zoo.encode(jpeg_zoo.picture(48, 32, 7), quality=80),
    jpeg_zoo.encode(jpeg_zoo.picture(48, 32, 8), quality=80, progressive=True),
)


@needs_extension
@pytest.mark.timeout(120)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_SEEDS),
    st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=6),
    st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=2),
    st.floats(0, 1),
)
def test_keep_failure_is_decode_failure_on_random_damage(
    seed: bytes, edits: list[tuple[float, int]], markers: list[tuple[float, int]], cut: float
) -> None:
    """Bytes changed anywhere (headers and scans), markers inserted, the end cut off: the same outcome and reason."""
    data = bytearray(seed)
    for where, value in edits:
        data[int(where * len(data))] = value
    for where, marker in markers:
        at = int(where * len(data))
        data[at:at] = bytes([0xFF, marker])
    data = bytes(data[: max(2, int(cut * len(data)))] if cut < 0.5 else data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Image, "MAX_IMAGE_PIXELS", 500_000)  # a damaged size stays small to decode
        info = inspect_jpeg(data)
        if info is not None and codec._too_large(info.width, info.height):
            return
        assert keep_failure(data) == decode_failure(data)


@pytest.mark.timeout(180)
def test_prepare_image_decides_alike_with_either_check(files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    through_extension = {name: prepare_image(data) for name, data in files.items()}
    monkeypatch.setattr(codec, "_scan_problem", None)
    for name, data in files.items():
        assert prepare_image(data) == through_extension[name], name


@needs_extension
@pytest.mark.parametrize("name", ["baseline 4:2:0 q95", "progressive", "restart markers every 3 MCUs", "baseline 4:4:4"])
def test_a_clean_jpeg_is_kept_without_pillows_decode(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = jpeg_zoo.encodings()[name]

    def no_decode(data: bytes) -> None:
        raise AssertionError("Pillow's whole decode was called")

    monkeypatch.setattr(codec, "decode_failure", no_decode)
    assert prepare_image(data) == codec.Prepared(data, "kept", None)


@needs_extension
@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("unknown marker 0xFF02 in the scan", "Unsupported marker type 0x02"),
        ("second SOI in the scan", "Invalid JPEG file structure: two SOI markers"),
        ("SOS marker in the scan", "Didn't expect more than one scan"),
        ("DHT marker in the scan", "Bogus marker length"),
        ("progressive cut at 30% of the scan", "Premature end of JPEG file"),
        ("3 components, sampling 3x1 and 2x1 (fractional)", "Fractional sampling not implemented yet"),
        ("restart markers out of order", None),
        ("baseline 240 extraneous bytes before EOI", None),
        ("EOI in the middle of the scan", None),
        ("APP marker running past the end in the scan", None),
    ],
)
def test_the_scan_check_reports_libjpegs_errors_and_ignores_its_warnings(name: str, problem: str | None) -> None:
    data = jpeg_zoo.damaged()[name]
    found = codec._scan_problem(data)
    if problem is None:
        assert found is None and decode_failure(data) is None
    else:
        assert found == problem and decode_failure(data) is not None


@pytest.mark.timeout(180)
def test_the_loaders_decode_every_jpeg_pack_keeps(files: dict[str, bytes]) -> None:
    torch = pytest.importorskip("torch")
    from imgpipe.loaders.geometry import EvalGeometry, TrainGeometry, sample_crop
    from imgpipe.loaders.pixels import decode_sample

    kept = {name: prepared.data for name, data in files.items() if (prepared := prepare_image(data)).action == "kept"}
    assert len(kept) >= 150
    train, evaluation = TrainGeometry(image_size=64), EvalGeometry(image_size=64)
    for k, (name, data) in enumerate(kept.items()):
        for crop_for in (lambda w, h: sample_crop(train, w, h, seed=0, epoch=0, index=k), evaluation.crop):  # noqa: B023
            sample = decode_sample(data, crop_for, 64)
            assert sample.shape == (3, 64, 64) and sample.dtype == torch.uint8, name


@pytest.mark.dali
@pytest.mark.timeout(180)
def test_dalis_cpu_decoder_decodes_every_jpeg_pack_keeps(files: dict[str, bytes], tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types

    kept = [prepared.data for data in files.values() if (prepared := prepare_image(data)).action == "kept"]
    paths = []
    for k, data in enumerate(kept):
        paths.append(str(tmp_path / f"{k}.jpg"))
        Path(paths[-1]).write_bytes(data)

    @pipeline_def(batch_size=len(paths), num_threads=1, device_id=None)
    def decode_all():
        jpegs, _ = fn.readers.file(files=paths, random_shuffle=False)
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)

    pipe = decode_all()
    pipe.build()
    (batch,) = pipe.run()
    for k, data in enumerate(kept):
        with Image.open(io.BytesIO(data)) as image:
            assert batch.at(k).shape == (image.height, image.width, 3)


@needs_extension
@pytest.mark.timeout(300)
def test_a_pack_of_the_corruptions_passes_verify_decode_and_is_the_same_with_either_check(
    corruptions: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src" / "train"
    for k, data in enumerate(corruptions.values()):
        (src / f"n{k % 4:08d}").mkdir(parents=True, exist_ok=True)
        (src / f"n{k % 4:08d}" / f"{k:03d}.JPEG").write_bytes(data)
    refused = sum(decode_failure(data) is not None for data in corruptions.values())
    outputs = []
    for check in ("libjpeg-turbo", "pillow"):
        if check == "pillow":
            monkeypatch.setattr(codec, "_scan_problem", None)  # the forked workers inherit it
        dst = tmp_path / check
        report = pack(tmp_path / "src", dst, shards=3, workers=2, progress=False)
        assert len(report.skipped) == refused >= 20
        outputs.append({p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.is_file()})
    assert outputs[0] == outputs[1]
    result = subprocess.run([sys.executable, "-m", "imgpipe", "verify", str(dst), "--decode"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout


@needs_extension
def test_a_pack_without_the_c_extension_says_so_once(
    synth_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "_jpeg_shrink) is not built" in r.getMessage()]

    with caplog.at_level(logging.WARNING):
        pack(synth_tree, tmp_path / "with", shards=1, splits=["val"], workers=1, progress=False)
        assert said() == []
        monkeypatch.setattr(codec, "_scan_problem", None)
        pack(synth_tree, tmp_path / "without", shards=1, splits=["val"], workers=1, progress=False)
    assert len(said()) == 1 and "libjpeg-turbo" in said()[0].getMessage() and "\n" not in said()[0].getMessage()
    assert "manylinux wheel" in said()[0].getMessage() and "libjpeg62-turbo-dev" in said()[0].getMessage()  # the fix
