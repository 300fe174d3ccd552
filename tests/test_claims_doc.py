"""The documentation stays true to the suite: every test that the README, docs/claims.md or another
docs/ page cites exists, and every row of docs/claims.md cites a test or says how it is measured."""

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
            if not (ROOT / path).is_file()
            or not re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M)]  # fmt: skip


def test_claims_doc_cites_the_suite() -> None:
    assert len(set(CITATION.findall((ROOT / "docs" / "claims.md").read_text(encoding="utf-8")))) > 100


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_test_exists(page: Path) -> None:
    assert missing_tests(page.read_text(encoding="utf-8")) == [], f"{page.name} cites tests that do not exist"


def test_a_citation_of_a_test_that_does_not_exist_is_caught() -> None:
    assert missing_tests("see `tests/test_claims_doc.py::test_every_cited_test_exists`") == []
    assert missing_tests("see `tests/test_claims_doc.py::test_that_was_renamed`") == ["tests/test_claims_doc.py::test_that_was_renamed"]
    assert missing_tests("see `tests/no_such_file.py::test_x`") == ["tests/no_such_file.py::test_x"]


def unbacked_rows(text: str) -> list[str]:
    """The claims of ``text``'s table rows whose last cell neither cites a test nor says how the claim is
    measured or why nothing tests it ("measured by `benchmarks/<script>.py`", "no test ...")."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or re.fullmatch(r":?-+:?", cells[-1]) or cells[-1] == "tests":
            continue
        if not CITATION.search(cells[-1]) and not re.match(r"(measured\b.*|no test\b.*)", cells[-1]):
            rows.append(cells[0])
    return rows


def test_every_claim_cites_a_test_or_says_how_it_is_measured() -> None:
    assert unbacked_rows((ROOT / "docs" / "claims.md").read_text(encoding="utf-8")) == []


def test_a_claim_row_without_a_test_or_a_measurement_is_caught() -> None:
    table = (
        "| claim | tests |\n| --- | --- |\n"
        "| cited | `tests/test_claims_doc.py::test_every_cited_test_exists` |\n"
        "| measured | measured by `benchmarks/loaders.py` |\n"
        "| bare | |\n| vague | see above |\n"
    )
    assert unbacked_rows(table) == ["bare", "vague"]


def test_every_benchmark_a_claim_names_exists() -> None:
    named = set(re.findall(r"benchmarks/[\w/]+\.py", (ROOT / "docs" / "claims.md").read_text(encoding="utf-8")))
    assert named and [path for path in sorted(named) if not (ROOT / path).is_file()] == []
