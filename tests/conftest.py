"""pytest's hooks and the fixtures every test folder shares: TensorFlow quiet before any test
module loads it, the --launcher-turns option, what applies to one Keras stack deselected on the
other, the ``launcher`` parameter, the tally of fault cases, ``small_disk``, and what collection
imported frozen out of the garbage collector's sight. The helpers the test files import (jobs,
checks, data) are in helpers.py.
"""
from __future__ import annotations

import gc
import subprocess
import zlib
from pathlib import Path

import pytest

from helpers import LAUNCHERS, skip_unless_optional
from stack import keras3
from hvdtrain.launch import rank_process


def pytest_configure(config) -> None:
    rank_process.quiet_tensorflow()  # before any test module loads TensorFlow


# --launcher-turns: the main stack's lanes, and the other stack's.
TURNS = ("main", "other")


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--launcher-turns", choices=TURNS, default=None,
        help="main: a test marked either_launcher runs under one launcher; other: every test "
             "that runs under both launchers runs under one, the one main does not pick for it "
             "(make test's lanes on the main and the other stack; without it, both)")


def deselect(config, items, dropped) -> None:
    """Removes ``dropped`` (node ids) from ``items``, reported as deselected, not skipped."""
    if dropped:
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in dropped])
        items[:] = [item for item in items if item.nodeid not in dropped]


def pytest_collection_modifyitems(config, items) -> None:
    if not keras3():   # what applies to one stack is deselected on the other
        deselect(config, items, {i.nodeid for i in items if "keras3_only" in i.keywords})
    turns = config.getoption("--launcher-turns")
    if turns is None:
        return
    alike: dict[str, list] = {}   # the same test and parameters but for the launcher
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec else {}
        if params.pop("launcher", None) in LAUNCHERS:
            key = f"{item.module.__name__}::{item.originalname}{sorted(params.items())!r}"
            alike.setdefault(key, []).append(item)
    left_out = set()
    for key, group in alike.items():
        if len(group) < 2 or (turns == "main" and "either_launcher" not in group[0].keywords):
            continue
        chosen = launcher_for(key, turns)
        left_out |= {item.nodeid for item in group
                     if item.callspec.params["launcher"] != chosen}
    deselect(config, items, left_out)


def launcher_for(key: str, turns: str) -> str:
    """The one launcher a test (``key``: its module, name and parameters but the launcher)
    runs under in the lane ``turns``: a fixed pick per test, so the launchers take turns from
    test to test, and the other stack's lane takes the launcher the main lane does not."""
    pick = zlib.crc32(key.encode()) % len(LAUNCHERS)
    return LAUNCHERS[pick if turns == "main" else (pick + 1) % len(LAUNCHERS)]


@pytest.fixture(params=LAUNCHERS)
def launcher(request) -> str:
    return request.param


# ---------------------------------------------------------------------------------------------
# The tally of fault and bad-input cases (tests marked ``fault``), printed after every run.

_FAULT_OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report) -> None:
    if "fault" not in report.keywords:
        return
    if report.when == "call" or report.outcome != "passed":  # a setup failure counts too
        _FAULT_OUTCOMES.setdefault(report.nodeid, report.outcome)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _FAULT_OUTCOMES:
        return
    outcomes = list(_FAULT_OUTCOMES.values())
    tried = sum(o != "skipped" for o in outcomes)
    passed = outcomes.count("passed")
    skipped = outcomes.count("skipped")
    terminalreporter.write_sep("-", "fault and bad-input cases")
    terminalreporter.write_line(f"fault and bad-input cases: {tried} tried, {passed} passed"
                                + (f", {skipped} skipped" if skipped else ""))
    for nodeid, outcome in _FAULT_OUTCOMES.items():
        if outcome != "passed":
            terminalreporter.write_line(f"  {outcome}: {nodeid}")


@pytest.fixture
def small_disk(tmp_path):
    """make(size, *mount options) -> a tmpfs of that size under tmp_path (root only), unmounted
    when the test ends."""
    mounts: list[Path] = []

    def make(size: str, *options: str) -> Path:
        path = tmp_path / f"disk{len(mounts)}"
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]),
                               "tmpfs", str(path)], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            skip_unless_optional(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(path)
        return path
    yield make
    for path in reversed(mounts):
        subprocess.run(["umount", str(path)], check=False, timeout=30)


def pytest_collection_finish(session) -> None:
    # What collection imported (TensorFlow with its thousands of modules, the test modules)
    # lives as long as the session: out of the garbage collector's sight, as
    # rank_process.load_tensorflow does in a rank, so that each full collection during the tests
    # scans what the tests made, not all of TensorFlow again.
    gc.freeze()
