"""docs/claims.md stays true to the suite: every test it cites exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_cited_test_exists() -> None:
    cited = set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", (ROOT / "docs" / "claims.md").read_text(encoding="utf-8")))
    assert len(cited) > 100
    missing = [f"{path}::{name}" for path, name in sorted(cited)
               if not (ROOT / path).is_file() or not re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M)]  # fmt: skip
    assert missing == [], "docs/claims.md cites tests that do not exist"
