"""docs/testing.md names only tests that exist, and has a row for every test file."""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent
DOC = TESTS.parent / "docs" / "testing.md"
# `test_x.py` or `tests/test_x.py`, optionally `::test_name` (a parameter id in [] allowed).
NAMED = re.compile(r"`(?:tests/)?(test_\w+\.py)(?:::(\w+)(?:\[[^`\]]*\])?)?`")


def missing_names(doc: str, tests: Path) -> list[str]:
    """The test files and functions ``doc`` names that ``tests`` does not hold."""
    missing = []
    for file, function in NAMED.findall(doc):
        path = tests / file
        if not path.is_file():
            missing.append(file)
        elif function and not re.search(rf"^def {function}\(", path.read_text(), re.M):
            missing.append(f"{file}::{function}")
    return missing


def undocumented_files(doc: str, tests: Path) -> list[str]:
    named = {file for file, _ in NAMED.findall(doc)}
    return sorted(p.name for p in tests.glob("test_*.py") if p.name not in named)


def test_every_test_docs_testing_md_names_exists_and_every_file_has_a_row():
    doc = DOC.read_text()
    assert missing_names(doc, TESTS) == []
    assert undocumented_files(doc, TESTS) == []


def test_control_a_missing_file_or_function_and_a_file_left_out_are_caught():
    doc = ("| `test_sharding.py` | ... |\n`tests/test_sharding.py::test_no_such_test` and "
           "`test_no_such_file.py::test_x`; "
           "`test_sharding.py::test_shards_are_disjoint_and_complete[1-4]`")
    assert missing_names(doc, TESTS) == ["test_sharding.py::test_no_such_test",
                                         "test_no_such_file.py"]
    assert "test_testing_doc.py" in undocumented_files(doc, TESTS)
