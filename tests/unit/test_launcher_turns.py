"""conftest's collection hook: --launcher-turns other (make test's lane on the other stack),
where a test that runs under both launchers runs under exactly one of them, the launchers take
turns, and nothing else is left out; --launcher-turns main (the main stack's lanes), where only
the tests marked either_launcher do, each under the launcher the other lane leaves out; and the
keras3_only tests, deselected (not skipped) on Keras 2."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from helpers import LAUNCHERS, ROOT


def load_conftest():
    """tests/conftest.py itself: ``import conftest`` takes whichever folder's conftest pytest
    loaded first (tests/multirank/ and tests/cluster/ have theirs)."""
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conftest = load_conftest()

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

# Tests under both launchers (some with one fixture for both, some marked either_launcher),
# bad-input cases under both and under one: every kind of case the option meets.
FILES = ["tests/multirank/test_multirank.py", "tests/multirank/test_library.py"]
# Longest first: a launcher's name may begin another's (mpi, mpi-tcp).
NAMES = "|".join(re.escape(name) for name in sorted(LAUNCHERS, key=len, reverse=True))
LAUNCHER_IN_ID = re.compile(rf"(?<=[\[-])({NAMES})(?=[\]-])")


def collected(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *FILES, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_each_test_under_both_launchers_runs_under_one_of_them_in_turn():
    both, turns = collected(), collected("--launcher-turns", "other")
    left_out = both - turns
    assert turns <= both and left_out
    twin = {nodeid: LAUNCHER_IN_ID.sub("*", nodeid) for nodeid in both}
    kept_twins = {twin[nodeid] for nodeid in turns}
    # Every test left out has its twin (the same but for the launcher) kept, once.
    assert all(twin[nodeid] in kept_twins for nodeid in left_out), sorted(left_out)
    assert len(kept_twins) == len(turns)
    # Of the tests that had both, each launcher keeps some: turns, not always the same one.
    paired = {twin[nodeid] for nodeid in left_out}
    kept_of_pairs = [nodeid for nodeid in turns if twin[nodeid] in paired]
    for launcher in LAUNCHERS:
        assert any(launcher in LAUNCHER_IN_ID.findall(n) for n in kept_of_pairs), launcher


def test_the_main_lanes_leave_out_only_either_launcher_tests_and_under_the_other_launcher():
    both, main, other = (collected(), collected("--launcher-turns", "main"),
                         collected("--launcher-turns", "other"))
    marked = collected("-m", "either_launcher")
    left_out = both - main
    assert left_out and left_out <= marked            # only the marked tests lose a launcher
    assert main - marked == both - marked              # the rest keep both (the control)
    twin = {nodeid: LAUNCHER_IN_ID.sub("*", nodeid) for nodeid in both}
    for nodeid in main & marked:
        assert sum(twin[n] == twin[nodeid] for n in main) == 1, nodeid   # one launcher each,
        assert nodeid not in other, nodeid          # and the other stack's lane takes the other


class Collected:
    """What the hook sees of pytest's config: no --launcher-turns, and a deselected report."""
    def __init__(self) -> None:
        self.deselected: list[str] = []
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(
            i.nodeid for i in items))

    def getoption(self, name: str) -> None:
        return None


def test_keras3_only_tests_are_deselected_on_keras2_and_kept_on_keras3(monkeypatch):
    marked = {"t.py::plain": {}, "t.py::mine": {"keras3_only": True, "core": True},
              "t.py::core": {"core": True}}
    for major, dropped in ((2, ["t.py::mine"]), (3, [])):   # Keras 3: the control, all kept
        monkeypatch.setattr(conftest, "keras3", lambda m=major: m == 3)
        items = [SimpleNamespace(nodeid=n, keywords=k) for n, k in marked.items()]
        config = Collected()
        conftest.pytest_collection_modifyitems(config, items)
        assert [i.nodeid for i in items] == [n for n in marked if n not in dropped], major
        assert config.deselected == dropped, major    # reported as deselected, not skipped
