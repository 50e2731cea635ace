"""Shared helpers: launching real multi-rank jobs under horovodrun (Gloo) or mpirun (MPI)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hvdtrain import launching

BIN = launching.BIN
TESTS = Path(__file__).parent
LAUNCHERS = list(launching.LAUNCHERS)


@dataclass
class Launched:
    returncode: int
    output: str
    seconds: float


def pytest_configure(config) -> None:
    launching.quiet_tensorflow()  # before any test module loads TensorFlow


launcher_env = launching.launch_env
launch_command = launching.launch_command


def launch(launcher: str, np_: int, argv: list[str], *, cwd: Path | None = None,
           timeout: float = 300, env: dict[str, str] | None = None) -> Launched:
    """Runs a job to completion and returns its exit status and combined output."""
    start = time.monotonic()
    proc = subprocess.run(launch_command(launcher, np_, argv), cwd=cwd,
                          env={**launcher_env(), **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    return Launched(proc.returncode, proc.stdout, time.monotonic() - start)


def worker(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(TESTS / "multirank_worker.py"), "--out", str(out), *args]


def hvdtrain(*args: str) -> list[str]:
    return [str(BIN / "hvdtrain"), *args]


@pytest.fixture(params=LAUNCHERS)
def launcher(request) -> str:
    return request.param


def assert_one_error_line(job: Launched, launcher: str, expected: str) -> str:
    """A user error under a launcher: one 'hvdtrain: error:' line that holds ``expected``,
    exit status 2, no rank's traceback, within a minute. Returns the line."""
    errors = [line for line in job.output.splitlines() if "hvdtrain: error:" in line]
    assert len(errors) == 1, job.output
    assert expected in errors[0], errors[0]
    if launcher == "gloo":  # horovodrun adds its own RuntimeError traceback; ranks must not
        assert "exit with status code 2" in job.output, job.output
        assert not re.search(r"^\[\d+\]<std(out|err)>:Traceback", job.output, re.M), job.output
    else:
        assert job.returncode == 2 and "Traceback" not in job.output, job.output
    assert job.seconds < 60
    return errors[0]


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


# ---------------------------------------------------------------------------------------------
# Tests that must run where the suite is expected to run everything

def expects_root_tests() -> bool:
    """True where a skip of the root-only tests (mounts, namespaces) would hide coverage: CI as
    root, unless HVDTRAIN_EXPECT_ROOT_TESTS=0; HVDTRAIN_EXPECT_ROOT_TESTS=1 asks for it
    anywhere."""
    asked = os.environ.get("HVDTRAIN_EXPECT_ROOT_TESTS", "")
    if asked:
        return asked not in ("0", "false", "no")
    return os.environ.get("CI", "").lower() not in ("", "0", "false") and os.geteuid() == 0


def skip_unless_optional(reason: str) -> None:
    """Skips with ``reason``, or fails where these tests are expected to run (CI as root)."""
    if expects_root_tests():
        pytest.fail(f"expected to run here (CI as root, or HVDTRAIN_EXPECT_ROOT_TESTS=1) but "
                    f"cannot: {reason}", pytrace=False)
    pytest.skip(reason)
