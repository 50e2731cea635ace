"""The wheel a user pip-installs: no pin that would replace their TensorFlow or build Horovod in
pip's isolation, and what a checkout keeps outside the package (launch scripts, Horovod's
patches, docs) shipped inside it, found there by the installed code."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from helpers import ROOT, launcher_env, run_job
from hvdtrain import __version__

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks



def test_wheel_ships_scripts_patches_and_docs_and_pins_no_tensorflow_or_horovod(tmp_path):
    # From a copy of the sources: a checkout's build/ folder could hold an earlier build's files.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "runs", "__pycache__", ".pytest_cache"))
    built = run_job([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                     "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(source)],
                    timeout=180)
    assert built.returncode == 0, built.output
    wheel = next((tmp_path / "wheel").glob("hvdtrain-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
        archive.extractall(tmp_path / "site")
    for shipped in ("run_scripts/local.sh", "run_scripts/slurm.sbatch",
                    "patches/horovod-0.28.1-xla-headers-gpu-only.patch",
                    "patches/horovod-0.28.1-fast-build-check.patch",
                    "patches/horovod-0.28.1-quiet-build-check.patch",
                    "patches/horovod-0.28.1-allreduce-in-place.patch",
                    "patches/horovod-0.28.1-no-distutils.patch", "docs/cluster.md"):
        assert f"hvdtrain/shipped/{shipped}" in names, sorted(names)
    # One top-level package, hvdtrain: the benchmarks inside it, without their results.
    assert {"hvdtrain/bench/registry.py", "hvdtrain/bench/shared/cost_model.py"} <= names
    tops = {n.split("/", 1)[0] for n in names if ".dist-info/" not in n}
    assert tops == {"hvdtrain"}, tops
    assert not [n for n in names if n.startswith(("benchmarks/", "results/"))
                or "/results/" in n]
    required = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert required == ["scikit-learn", "tensorboard"], required  # no TensorFlow, numpy, Horovod
    assert 'tensorflow-cpu<2.22,>=2.15; extra == "tensorflow-cpu"' in metadata
    # Apache-2.0, its text and the NOTICE of the Horovod patches inside the wheel.
    assert "License: Apache-2.0" in metadata
    assert {"LICENSE", "NOTICE"} <= {n.rsplit("/", 1)[-1] for n in names if ".dist-info/" in n}

    # The installed code finds the wheel's copies, not the checkout's: the launch command runs
    # the shipped script (its usage names the command typed).
    env = launcher_env({"PYTHONPATH": str(tmp_path / "site")})
    where = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "launch", "local", "--path"],
                           env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert where.stdout.strip() == str(tmp_path / "site/hvdtrain/shipped/run_scripts/local.sh")
    usage = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "launch", "local", "--help"],
                           env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert usage.returncode == 0 and "usage: hvdtrain launch local N" in usage.stdout, usage
    # The version alone: an installed wheel has no commit to name.
    named = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "--version"], env=env,
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert named.stdout == f"hvdtrain {__version__}\n", named
    # `hvdtrain bench` finds the wheel's benchmarks (the checkout's are not on this path).
    bench = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "bench", "project", "--help"],
                           env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bench.returncode == 0 and "--link-gbitps" in bench.stdout, bench
    # Control: from the checkout (an editable install), the checkout's own scripts.
    here = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "launch", "local", "--path"],
                          env=launcher_env(), capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert here.stdout.strip() == str(ROOT / "run_scripts" / "local.sh")
