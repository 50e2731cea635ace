"""scripts/setup.sh refuses a Python its stack does not run on with one line, before it installs
anything: keras3 runs on 3.11 to 3.13, keras2 (TensorFlow 2.15) on 3.11 alone."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks


def _fake_python(folder: Path, version: str, name: str = "python-fake") -> Path:
    fake = folder / name
    fake.parent.mkdir(parents=True, exist_ok=True)
    # Answers `-V` with the version and the setup's question for sys.version_info with its
    # major.minor, as that Python would; anything else (`-m venv`) does nothing.
    major_minor = ".".join(version.split(".")[:2])
    fake.write_text("#!/bin/sh\n"
                    f'[ "$1" = -V ] && {{ echo "Python {version}"; exit 0; }}\n'
                    f'case "$2" in *version_info*) echo {major_minor} ;; esac\n'
                    "exit 0\n")
    fake.chmod(0o755)
    return fake


def _setup(tmp_path: Path, python: Path, stack: str = "keras3") -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(python), "HVDTRAIN_STACK": stack,
           "HVDTRAIN_VENV": str(tmp_path / "venv")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _errors(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_setup_refuses_python_310_with_one_line(tmp_path):
    result = _setup(tmp_path, _fake_python(tmp_path, "3.10.12"))
    assert result.returncode == 1
    assert _errors(result) == [f"[setup] error: hvdtrain needs Python 3.11, 3.12 or 3.13; "
                               f"{tmp_path}/python-fake is Python 3.10.12. Install python3.13 "
                               f"and run again with PYTHON=python3.13."], result.stderr
    assert not (tmp_path / "venv").exists()


def test_setup_refuses_a_python_that_does_not_run_with_one_line(tmp_path):
    # A missing interpreter, or a pyenv shim of a version pyenv does not select (it exits 127),
    # is named in the same one line, not a silent exit of `set -e`.
    missing = tmp_path / "python3.10"
    result = _setup(tmp_path, missing)
    assert result.returncode == 1
    assert _errors(result) == [f"[setup] error: hvdtrain needs Python 3.11, 3.12 or 3.13; "
                               f"{missing} is not found. Install python3.13 and run again with "
                               f"PYTHON=python3.13."], result.stderr
    shim = tmp_path / "python3.12"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    assert _errors(_setup(tmp_path, shim))[-1].endswith(f"{shim} is not found. Install "
                                                        f"python3.13 and run again with "
                                                        f"PYTHON=python3.13.")


@pytest.mark.parametrize("version", ["3.11.7", "3.12.1", "3.13.0"])
def test_setup_passes_the_version_check_on_311_to_313(tmp_path, version):
    # Control: the same fake as 3.11 to 3.13 gets past the check (and fails later, since it is
    # no real Python), so the refusal above is the version check's doing.
    result = _setup(tmp_path, _fake_python(tmp_path, version))
    assert "python-fake is Python" not in result.stderr
    assert "creating virtualenv" in result.stdout


def test_keras2_stack_refuses_python_312_with_one_line(tmp_path):
    result = _setup(tmp_path, _fake_python(tmp_path, "3.12.1"), stack="keras2")
    assert result.returncode == 1
    assert _errors(result) == [f"[setup] error: the keras2 stack needs Python 3.11 (TensorFlow "
                               f"2.15 stops there); {tmp_path}/python-fake is Python 3.12.1. "
                               f"Install python3.11 and run again with PYTHON=python3.11."], \
        result.stderr
    assert not (tmp_path / "venv").exists()
    # Control: 3.11 gets past it on the same stack.
    result = _setup(tmp_path, _fake_python(tmp_path, "3.11.7"), stack="keras2")
    assert "creating virtualenv" in result.stdout and "python-fake is Python" not in result.stderr


def test_a_venv_on_another_python_than_the_one_asked_for_is_made_anew(tmp_path):
    _fake_python(tmp_path / "venv" / "bin", "3.11.7", name="python")
    result = _setup(tmp_path, _fake_python(tmp_path, "3.12.1"))
    assert (f"{tmp_path}/venv runs Python 3.11.7, not Python 3.12.1 "
            f"(PYTHON={tmp_path}/python-fake): making it anew") in result.stdout, result.stdout
    assert not (tmp_path / "venv").exists()   # the fake's `-m venv` makes nothing
    # Control: asked for the Python it runs, the venv is kept.
    _fake_python(tmp_path / "venv" / "bin", "3.12.1", name="python")
    result = _setup(tmp_path, _fake_python(tmp_path, "3.12.1"))
    assert "making it anew" not in result.stdout
    assert (tmp_path / "venv" / "bin" / "python").exists()


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


def test_has_version_does_not_read_a_distribution_from_the_working_folder(tmp_path):
    # `pip wheel .` (the README's way to a wheel) leaves hvdtrain.egg-info in the checkout, from
    # which setup.sh runs: read from there, it made a venv without hvdtrain look installed, and
    # `make demo` found no hvdtrain command. setup.sh's has_version, alone, on a folder holding
    # such metadata:
    (tmp_path / "somedist.egg-info").mkdir()
    (tmp_path / "somedist.egg-info" / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: somedist\nVersion: 1.0\n")
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    function = setup[setup.index("has_version() {"):setup.index("\nPYEOF\n}\n") + 8]
    probe = lambda body: subprocess.run(
        ["bash", "-c", f'{body}\nPY="$1"; has_version somedist ""', "bash", sys.executable],
        cwd=tmp_path, capture_output=True, text=True, timeout=60).returncode
    assert probe(function) == 1, "has_version read the working folder's egg-info"
    assert probe(function.replace('"$PY" -P -', '"$PY" -')) == 0   # control: without -P it does


@pytest.mark.skipif(os.geteuid() != 0, reason="setup.sh would run apt-get by sudo, past the fake")
@pytest.mark.parametrize("ready", [False, True], ids=["bare", "control-ready"])
def test_setup_installs_debians_python_venv_and_headers_where_python3_lacks_them(tmp_path, ready):
    # A minimal Debian 12 has no python3, and Debian's python3 alone has neither ensurepip
    # (python3-venv) nor Python.h (python3-dev): make fresh-machine stopped there. A fake
    # python3 fails (or, the control, passes) setup's check of both, and a fake apt-get records
    # what setup asks of it; the fake python3 then stops setup at the version check.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\ncase "$2" in *ensurepip*) exit {0 if ready else 1} ;; esac\nexit 1\n')
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$*" >>{tmp_path}/apt.log\n')
    for fake in bin_dir.iterdir():
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HVDTRAIN_VENV": str(tmp_path / "venv")}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env,
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    asked = (tmp_path / "apt.log").read_text() if (tmp_path / "apt.log").exists() else ""
    said = "[setup] installing python3, python3-venv and python3-dev (apt)"
    assert (said in result.stdout) is not ready, result.stdout
    assert ("install -y -qq python3 python3-venv python3-dev" in asked) is not ready, asked
    assert "python3 is not found" in result.stderr   # the fake stops it there, either way
