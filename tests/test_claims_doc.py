"""The documentation stays true to the suite: every test that the README, docs/claims.md or another
docs/ page cites exists, and every row of docs/claims.md cites a test or says how it is measured."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# ``tests/<file>.py::<test>``, ``<file>.py::<test>`` (a file of tests/ by its name) and ``::<test>`` (the file last cited);
# a test's name alone in backticks names a test of some file
CITATION = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py)?::(test_\w+)")
BARE_NAME = re.compile(r"`(test_\w+)`")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def citations(text: str) -> list[tuple[str, Path | None, str]]:
    """Every test ``text`` cites, in order: (the citation as written, the file it names or None, the test)."""
    found, last = [], None
    for match in CITATION.finditer(text):
        path, name = match.groups()
        if path is None:
            file = last
        elif path.startswith("tests/"):
            file = ROOT / path
        else:
            named = sorted(TESTS.rglob(path))
            file = named[0] if len(named) == 1 else None  # none, or a name two files share: unresolved
        found.append((match.group(0), file, name))
        last = file
    return found


def missing_tests(text: str) -> list[str]:
    """The citations in ``text`` whose file or test function does not exist (shown with the file they resolve to),
    then the test names cited alone that no file of tests/ defines."""
    missing = [f"{cited} ({'no such file' if file is None else file.relative_to(ROOT)})" for cited, file, name in citations(text)
               if file is None or not file.is_file()
               or not re.search(rf"^def {name}\(", file.read_text(encoding="utf-8"), re.M)]  # fmt: skip
    return missing + [f"`{name}`" for name in BARE_NAME.findall(text) if name not in defined_tests()]


@functools.cache
def defined_tests() -> frozenset[str]:
    """The name of every test function of tests/."""
    texts = [path.read_text(encoding="utf-8") for path in TESTS.rglob("*.py")]
    return frozenset(name for text in texts for name in re.findall(r"^def (test_\w+)\(", text, re.M))


def test_claims_doc_cites_the_suite() -> None:
    assert len({(file, name) for _, file, name in citations((ROOT / "docs" / "claims.md").read_text(encoding="utf-8"))}) > 100


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_test_exists(page: Path) -> None:
    assert missing_tests(page.read_text(encoding="utf-8")) == [], f"{page.name} cites tests that do not exist"


def test_a_citation_of_a_test_that_does_not_exist_is_caught() -> None:
    assert missing_tests("see `tests/test_claims_doc.py::test_every_cited_test_exists`") == []
    assert missing_tests("see `tests/test_claims_doc.py::test_that_was_renamed`") == [
        "tests/test_claims_doc.py::test_that_was_renamed (tests/test_claims_doc.py)"
    ]
    assert missing_tests("see `tests/no_such_file.py::test_x`") == ["tests/no_such_file.py::test_x (tests/no_such_file.py)"]


def test_short_citations_resolve_by_file_name_and_to_the_file_cited_last() -> None:
    text = "`test_claims_doc.py::test_every_cited_test_exists`, `::test_claims_doc_cites_the_suite`; then `::test_gone`"
    assert [(file.relative_to(ROOT), name) for _, file, name in citations(text)] == [  # type: ignore[union-attr]
        (Path("tests/test_claims_doc.py"), "test_every_cited_test_exists"),
        (Path("tests/test_claims_doc.py"), "test_claims_doc_cites_the_suite"),
        (Path("tests/test_claims_doc.py"), "test_gone"),
    ]
    assert missing_tests(text) == ["::test_gone (tests/test_claims_doc.py)"]
    assert missing_tests("`::test_x` before any file") == ["::test_x (no such file)"]
    assert missing_tests("`conftest.py::test_x`: two files have that name") == ["conftest.py::test_x (no such file)"]
    assert missing_tests("`train/test_output_dir.py::test_a_rerun_without_resume_is_refused_and_overwrite_starts_afresh`") == []
    assert missing_tests("as `test_claims_doc_cites_the_suite` checks, and `test_that_was_renamed`") == ["`test_that_was_renamed`"]


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
