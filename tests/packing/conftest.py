"""The keep path's check in both of its forms: libjpeg-turbo through imgpipe's extension, and Pillow's whole decode."""

from __future__ import annotations

import pytest

from imgpipe.packing import codec


@pytest.fixture(params=["libjpeg-turbo", "pillow"])
def scan_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which check ``codec.keep_failure`` makes: the extension's, or (hidden as on an installation
    built without a compiler; pack's workers are forked, so they inherit it) Pillow's whole decode."""
    if request.param == "pillow":
        monkeypatch.setattr(codec, "_scan_problem", None)
    elif codec._scan_problem is None:
        pytest.skip("imgpipe.packing._jpeg_shrink is not built")
    return request.param
