"""scripts/setup.sh refuses a Python other than 3.11 with one line, before it installs anything."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks


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


def _python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_horovodrun_build_check_answers_from_the_library_without_tensorflow():
    # scripts/patches/horovod-0.28.1-fast-build-check.patch: horovodrun asks whether Gloo and
    # MPI were built from the extension's library alone. The fast path must really be taken
    # (not its fallback, the TensorFlow import) and give the extension's own answers.
    fast = _python("import sys; from horovod.common import util\n"
                   "gloo = util._library_only('tensorflow', 'built with Gloo')\n"
                   "mpi = util._library_only('tensorflow', 'built with MPI')\n"
                   "assert gloo is not None and mpi is not None, 'the fast path failed'\n"
                   "assert 'tensorflow' not in sys.modules, 'the fast path imported TensorFlow'\n"
                   "print(gloo.gloo_built(), mpi.mpi_built())")
    imported = _python("import horovod.tensorflow as hvd; print(hvd.gloo_built(), hvd.mpi_built())")
    assert fast == imported.splitlines()[-1] == "True True"
    # Control: any other check (here "built": whether an extension exists) takes the import.
    _python("from horovod.common import util\n"
            "assert util._library_only('tensorflow', 'built') is None\n"
            "assert util._library_only('torch', 'built with MPI') is None")


CHECKED_QUIETLY = """
import os, sys
from horovod.common import util
def built(ext):
    os.write(2, b"a C++ line on file descriptor 2\\n")  # as TensorFlow 2.21's oneDNN line
    return ext.gloo_built()
print(util._check_extension_lambda('tensorflow', built, 'built with Gloo', {verbose}))
"""


def test_horovodrun_build_check_mutes_what_libraries_write_to_the_descriptors():
    # scripts/patches/horovod-0.28.1-quiet-build-check.patch: every horovodrun printed
    # TensorFlow 2.21's oneDNN line, which its library writes to fd 2 as it loads.
    quiet = subprocess.run([sys.executable, "-c", CHECKED_QUIETLY.format(verbose=False)],
                           capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "True", quiet.stderr[-2000:]
    assert "C++ line" not in quiet.stderr, quiet.stderr
    # Control: a verbose check is not muted, so the line does reach fd 2 from that process.
    loud = subprocess.run([sys.executable, "-c", CHECKED_QUIETLY.format(verbose=True)],
                          capture_output=True, text=True, timeout=120)
    assert "a C++ line on file descriptor 2" in loud.stderr, loud.stderr
