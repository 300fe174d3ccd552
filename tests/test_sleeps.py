"""No sleep stands in for an event in the tests: every ``time.sleep`` under tests/ is the pause of a polling loop
with a deadline, or its line says that elapsed time is what is tested (a comment with "elapsed")."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _is_sleep(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sleep"


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def bare_sleeps(source: str) -> list[int]:
    """The lines of ``source`` whose sleep is neither in a loop that checks a deadline nor marked as elapsed time."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not _is_sleep(node):
            continue
        loop = parents.get(node)
        while loop is not None and not isinstance(loop, (ast.While, ast.For)):
            loop = parents.get(loop)
        if loop is not None and {"deadline", "monotonic"} & _names(loop):
            continue
        if loop is not None and "deadline" in "\n".join(lines[max(0, loop.lineno - 3) : loop.lineno]):
            continue
        if "elapsed" in lines[node.lineno - 1] or "elapsed" in lines[node.lineno - 2]:
            continue
        found.append(node.lineno)
    return found


def test_every_sleep_in_the_tests_polls_with_a_deadline_or_says_that_elapsed_time_is_tested() -> None:
    bare = {f"{path.relative_to(TESTS)}:{line}" for path in TESTS.rglob("*.py") for line in bare_sleeps(path.read_text())}
    assert not bare, sorted(bare)


def test_the_rule_tells_a_wait_for_an_event_from_a_sleep_standing_in_for_one() -> None:
    polling = "import time\ndeadline = time.monotonic() + 5\nwhile not done() and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
    timed = "import time\ntime.sleep(0.5)  # elapsed time is what is tested: the read stage counts it\n"
    assert bare_sleeps(polling) == [] and bare_sleeps(timed) == []
    assert bare_sleeps("import time\nstart()\ntime.sleep(1)  # the helper is waiting on its requests\nkill()\n") == [3]
    assert bare_sleeps("import time\nwhile not done():\n    time.sleep(0.01)\n") == [3]
