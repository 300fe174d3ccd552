"""The documentation stays true to the suite: every test that the README, docs/claims.md or another
docs/ page cites exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def missing_tests(text: str) -> list[str]:
    """The ``tests/<file>.py::<test>`` citations in ``text`` whose file or test function does not exist."""
    cited = set(CITATION.findall(text))
    return [f"{path}::{name}" for path, name in sorted(cited)
            if not (ROOT / path).is_file() or not re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M)]  # fmt: skip


def test_claims_doc_cites_the_suite() -> None:
    assert len(set(CITATION.findall((ROOT / "docs" / "claims.md").read_text(encoding="utf-8")))) > 100


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_test_exists(page: Path) -> None:
    assert missing_tests(page.read_text(encoding="utf-8")) == [], f"{page.name} cites tests that do not exist"


def test_a_citation_of_a_test_that_does_not_exist_is_caught() -> None:
    assert missing_tests("see `tests/test_claims_doc.py::test_every_cited_test_exists`") == []
    assert missing_tests("see `tests/test_claims_doc.py::test_that_was_renamed`") == ["tests/test_claims_doc.py::test_that_was_renamed"]
    assert missing_tests("see `tests/no_such_file.py::test_x`") == ["tests/no_such_file.py::test_x"]
