"""scripts/compat.sh's axes: every TensorFlow version given on every Python of COMPAT_PYTHONS
(--plan prints the rows and runs nothing), and a Python that cannot run refused in one line
before any build."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks


def _compat(*args: str, pythons: str | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "COMPAT_PYTHONS"}
    if pythons is not None:
        env["COMPAT_PYTHONS"] = pythons
    return subprocess.run(["bash", str(ROOT / "scripts" / "compat.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _plan(*args: str, pythons: str | None = None) -> list[str]:
    result = _compat("--plan", *args, pythons=pythons)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_each_version_runs_on_every_python_in_turn():
    assert _plan("/tmp/w", "2.21.0", "2.18.1", pythons="3.12 /opt/py/bin/python3") == [
        "python3.12 2.21.0", "/opt/py/bin/python3 2.21.0",
        "python3.12 2.18.1", "/opt/py/bin/python3 2.18.1"]


def test_defaults_are_python311_and_every_minor_from_215_to_221():
    rows = _plan()
    assert rows == [f"python3.11 {v}" for v in
                    ("2.15.1", "2.16.2", "2.17.1", "2.18.1", "2.19.1", "2.20.0", "2.21.0")]
    assert _plan(pythons="") == rows   # an empty axis is the default


def test_a_python_that_does_not_run_is_refused_in_one_line_before_any_build(tmp_path):
    result = _compat(str(tmp_path / "work"), "2.21.0", pythons=f"{sys.executable} /nowhere/python3")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "[compat] error: /nowhere/python3 is no Python 3.11 or later: set COMPAT_PYTHONS"]
    assert not (tmp_path / "work").exists()   # nothing made: no venv, no wheel
