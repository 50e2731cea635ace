"""scripts/setup.sh refuses a Python other than 3.11 with one line, before it installs anything."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _fake_python(tmp_path: Path, version: str) -> Path:
    fake = tmp_path / "python-fake"
    major_minor = tuple(int(v) for v in version.split(".")[:2])
    # Answers `-V` with the version, and the setup's version check as that Python would.
    fake.write_text("#!/bin/sh\n"
                    f'[ "$1" = -V ] && {{ echo "Python {version}"; exit 0; }}\n'
                    f"exit {0 if major_minor == (3, 11) else 1}\n")
    fake.chmod(0o755)
    return fake


def _setup(tmp_path: Path, python: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(python),
           "HVDTRAIN_VENV": str(tmp_path / "venv")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_setup_refuses_python_310_with_one_line(tmp_path):
    result = _setup(tmp_path, _fake_python(tmp_path, "3.10.12"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == [f"[setup] error: hvdtrain needs Python 3.11; {tmp_path}/python-fake is "
                      f"Python 3.10.12. Install python3.11 and run again with "
                      f"PYTHON=python3.11."], result.stderr
    assert not (tmp_path / "venv").exists()


def test_setup_passes_the_version_check_on_311(tmp_path):
    # Control: the same fake as 3.11 gets past the check (and fails later, since it is no
    # real Python), so the refusal above is the version check's doing.
    result = _setup(tmp_path, _fake_python(tmp_path, "3.11.7"))
    assert "python-fake is Python" not in result.stderr
    assert "creating virtualenv" in result.stdout
