"""docs/testing.md names only tests that exist, and has a row for every test file."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import ROOT, TESTS

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

DOC = ROOT / "docs" / "testing.md"
# `test_x.py`, `tests/test_x.py` or `tests/FOLDER/test_x.py`, optionally `::test_name` (a
# parameter id in [] allowed).
NAMED = re.compile(r"`(?:tests/(?:\w+/)?)?(test_\w+\.py)(?:::(\w+)(?:\[[^`\]]*\])?)?`")


def files_by_name(tests: Path) -> dict[str, Path]:
    """Every test file in ``tests`` and its folders (unit/, multirank/, cluster/), by name."""
    return {path.name: path for path in tests.rglob("test_*.py")}


def missing_names(doc: str, tests: Path) -> list[str]:
    """The test files and functions ``doc`` names that ``tests`` does not hold."""
    missing = []
    files = files_by_name(tests)
    for file, function in NAMED.findall(doc):
        path = files.get(file)
        if path is None:
            missing.append(file)
        elif function and not re.search(rf"^def {function}\(", path.read_text(), re.M):
            missing.append(f"{file}::{function}")
    return missing


def undocumented_files(doc: str, tests: Path) -> list[str]:
    named = {file for file, _ in NAMED.findall(doc)}
    return sorted(name for name in files_by_name(tests) if name not in named)


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
