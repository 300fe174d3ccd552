"""Fixtures the loader tests share: each test run once per loader backend."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["torch", pytest.param("dali", marks=pytest.mark.dali)])
def backend(request: pytest.FixtureRequest) -> str:
    """Each test once per loader backend; the DALI run is skipped without DALI (failed under make test)."""
    if request.param == "dali":
        request.getfixturevalue("require_dali")
    return request.param
