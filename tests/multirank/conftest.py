"""The runs the multi-rank test files share, each made once per session by the first test that
asks (a launch costs seconds of TensorFlow import per rank): ``two_epochs``, which the resume
cases copy and resume (test_faults_bad_input.py's refusals, test_multirank.py's wrong resumes),
and ``four_straight_epochs``, what a run stopped and resumed must equal (test_multirank.py).
Both are helpers.RESUME_ARGS' job on 2 ranks under mpirun (at 2 ranks both launchers give the
same sums); a test copies a run before it resumes it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import RESUME_ARGS, assert_ok, hvdtrain, launch


def mpi_run(tmp_path_factory, epochs: int) -> Path:
    run = tmp_path_factory.mktemp(f"{epochs}-epochs") / "run"
    assert_ok(launch("mpi", 2, hvdtrain("train", *RESUME_ARGS, "--epochs", str(epochs),
                                        "--run-dir", str(run))), f"{epochs} epochs")
    return run


@pytest.fixture(scope="session")
def two_epochs(tmp_path_factory) -> Path:
    return mpi_run(tmp_path_factory, 2)


@pytest.fixture(scope="session")
def four_straight_epochs(tmp_path_factory) -> Path:
    return mpi_run(tmp_path_factory, 4)
