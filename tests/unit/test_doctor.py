"""``hvdtrain doctor`` and ``hvdtrain setup horovod --dry-run`` against real environments: the
healthy venv, and broken ones each test makes cheaply beside it (a Horovod built against the
other stack's TensorFlow, a Horovod without its TensorFlow ops, no mpirun on PATH)."""
from __future__ import annotations

import importlib.metadata
import re
import shutil
import sys
from pathlib import Path

import numpy
import pytest

from helpers import BIN, ROOT, launcher_env, run_job, skip_unless_optional
from stack import keras3
from hvdtrain import version
from hvdtrain.install import doctor, doctor_report, horovod_install, horovod_patches
from hvdtrain.launch import launchers

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

HOROVOD = Path(horovod_install.importlib.util.find_spec("horovod").origin).parent
# The other stack's venv: its Horovod was compiled against another TensorFlow than this one.
OTHER_VENV = ROOT / (".venv-keras2" if keras3() else ".venv")


def hvdtrain_cli(*args: str, env: dict[str, str]):
    return run_job([sys.executable, "-m", "hvdtrain.cli", *args], env=env, timeout=240)


def fail_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.lstrip().startswith("FAIL")]


def report_fields(output: str) -> dict[str, str]:
    """doctor --report's block: each field's first value, by name, in the block's order
    (inside its Markdown fence, whose lines are no field)."""
    block = output.split(doctor_report.BEGIN, 1)[-1].split(doctor_report.END, 1)[0]
    return {line[:doctor_report.WIDTH].rstrip(): line[doctor_report.WIDTH:].strip()
            for line in block.splitlines()
            if line.strip() and not line.startswith(" ") and line != doctor_report.FENCE}


def missing_fields(output: str) -> list[str]:
    """The fields doctor --report must print that ``output`` lacks or leaves empty."""
    fields = report_fields(output)
    return [name for name in doctor_report.FIELDS if not fields.get(name)]


# Set for the report to show: a Horovod and an Open MPI setting, and the MPI Operator's role.
REPORTED_ENV = {"HOROVOD_DOCTOR_MARK": "1", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "K_MPI_JOB_ROLE": "launcher"}


@pytest.mark.multirank
def test_doctor_passes_the_healthy_venv_with_a_checked_all_reduce_under_both_launchers():
    job = hvdtrain_cli("doctor", "--report", env=launcher_env(REPORTED_ENV))
    assert job.returncode == 0, job.output
    assert not fail_lines(job.output), job.output
    for launcher in launchers.MULTI_RANK:
        assert re.search(rf"^  ok +2 ranks {launcher} +every rank all-reduced 1 \+ 2 = 3 ",
                         job.output, re.M), job.output
    assert "ready: a 2-rank job works here" in job.output
    # This venv's Horovod was built with the in-place patch (test_in_place_allreduce.py tells
    # one without it): nothing to say about it.
    assert "in-place all-reduce patch" not in job.output, job.output
    # --report: every field, in order, and what this venv and environment hold.
    fields = report_fields(job.output)
    assert missing_fields(job.output) == [] and list(fields) == list(doctor_report.FIELDS)
    assert fields["tensorflow"] == horovod_install.tensorflow_version()
    # The fields held in detail by test_doctor_report.py, here with the real run's values.
    assert fields["numpy"] == numpy.__version__
    assert fields["hvdtrain"].startswith(f"{version.describe()} at ")
    assert "allreduce-in-place" in fields["horovod patches"]   # as said below
    assert "PyTorch" not in job.output.split(doctor_report.BEGIN)[1]
    fenced = f"{doctor_report.BEGIN}\n```\n", f"\n```\n{doctor_report.END}"
    assert all(line in job.output for line in fenced), job.output
    assert fields["keras"] == importlib.metadata.version("keras")
    assert "controllers: MPI, Gloo" in fields["horovod build"]
    assert fields["open mpi"].startswith("4.1")
    # What Open MPI 4.1 selected in the MPI smoke job, from its own verbose output: shared
    # memory (vader) between the two ranks of one host, ob1, tuned's collectives (self's on
    # Horovod's one-process communicators).
    assert re.match(r"(\w+, )*vader(, \w+)*, pml ob1 \(in the 2-rank MPI job here\)",
                    fields["open mpi btl"]), fields
    assert re.match(r"(\w+ \d+, )*tuned 30, .*\(in the 2-rank MPI job here, by priority\)",
                    fields["open mpi coll"]), fields
    for name, value in REPORTED_ENV.items():
        assert re.search(rf"^ +{name}={value}$|  {name}={value}$", job.output, re.M), name
    for launcher in launchers.MULTI_RANK:
        assert re.fullmatch(r"2 ranks, 2 MiB all-reduce \d+\.\d+ ms \(median of 5\)",
                            fields[f"all-reduce {launcher}"]), fields
    assert fields["checks"] == "every check ok"
    # Control: the same output with one field's line taken out fails the check.
    cut = re.sub(r"^nccl .*\n", "", job.output, flags=re.M)
    assert missing_fields(cut) == ["nccl"]


def _other_stacks_horovod(tmp_path: Path) -> dict[str, str]:
    built = sorted(OTHER_VENV.glob("lib/python3*/site-packages/horovod"))
    if not built:  # make test installs both stacks; make unit only the one it runs
        skip_unless_optional(f"no Horovod in {OTHER_VENV} (make install STACK=...)")
    (tmp_path / "horovod").symlink_to(built[0])
    return {"PYTHONPATH": f"{tmp_path}:{ROOT}"}


def _horovod_without_tensorflow_ops(tmp_path: Path) -> dict[str, str]:
    shutil.copytree(HOROVOD, tmp_path / "horovod", ignore=shutil.ignore_patterns("mpi_lib*.so"))
    return {"PYTHONPATH": f"{tmp_path}:{ROOT}"}


def _no_mpirun(tmp_path: Path) -> dict[str, str]:
    return {"PATH": str(BIN)}  # the venv's tools alone; Open MPI's live elsewhere


BROKEN = {  # case -> (the environment made, the problem named, the fixing command)
    "horovod_for_another_tensorflow": (_other_stacks_horovod,
                                       "Horovod was built against another TensorFlow",
                                       "hvdtrain setup horovod --rebuild"),
    "horovod_without_tensorflow_ops": (_horovod_without_tensorflow_ops,
                                       "Horovod has no TensorFlow ops",
                                       "hvdtrain setup horovod --rebuild"),
    "no_mpirun": (_no_mpirun, "mpirun not on PATH", "apt-get install openmpi-bin"),
}


@pytest.mark.fault
@pytest.mark.parametrize("case", list(BROKEN))
def test_doctor_names_a_broken_environment_in_one_line_and_exits_non_zero(case, tmp_path):
    make, problem, fix = BROKEN[case]
    env = launcher_env(make(tmp_path))
    job = hvdtrain_cli("doctor", env=env)
    assert job.returncode == 1, job.output
    failed = fail_lines(job.output)
    assert len(failed) == 1 and problem in failed[0] and fix in failed[0], job.output
    assert "Traceback" not in job.output
    assert "2 ranks" not in job.output  # no smoke test after a failed check
    # The control, the same doctor on the healthy venv exiting 0, is the test above.


def test_setup_horovod_builds_nothing_where_horovod_works_and_would_where_it_does_not(tmp_path):
    healthy = hvdtrain_cli("setup", "horovod", "--dry-run", env=launcher_env())
    assert healthy.returncode == 0, healthy.output
    assert "its ops load: nothing to build" in healthy.output
    broken = hvdtrain_cli("setup", "horovod", "--dry-run",
                          env=launcher_env(_horovod_without_tensorflow_ops(tmp_path)))
    assert broken.returncode == 1, broken.output
    assert "horovod needs a build: Horovod has no TensorFlow ops" in broken.output


def test_smoke_check_accepts_only_every_rank_with_the_right_sum():
    def line(rank: int, total: float, controller: str = "gloo") -> str:
        tag = launchers.entry("gloo").rank_tag(rank)   # as horovodrun --gloo tags it
        return (f'{tag}hvdtrain-smoke {{"rank": {rank}, "size": 2, '
                f'"controller": "{controller}", "sum": {total}}}')

    assert doctor.smoke_problem(f"{line(0, 3.0)}\n{line(1, 3.0)}", "gloo") is None
    # mpirun may forward both ranks' output as one line (seen: 'Extra data' from json.loads).
    both = 'hvdtrain-smoke {"rank": 0, "size": 2, "controller": "mpi", "sum": 3.0}' \
           'hvdtrain-smoke {"rank": 1, "size": 2, "controller": "mpi", "sum": 3.0}\n'
    assert doctor.smoke_problem(both, "mpi") is None
    # Controls: a wrong sum, a missing rank, the other controller.
    assert "wrong all-reduce" in doctor.smoke_problem(f"{line(0, 3.0)}\n{line(1, 2.0)}", "gloo")
    assert "ranks [0] reported" in doctor.smoke_problem(line(0, 3.0), "gloo")
    assert "wrong all-reduce" in doctor.smoke_problem(f"{line(0, 3.0)}\n{line(1, 3.0)}", "mpi")


def test_tensorflow_range_is_checked_with_the_install_command():
    assert horovod_install.tensorflow_problem("2.15.1") is None
    assert horovod_install.tensorflow_problem("2.21.0") is None
    for outside in ("2.14.1", "2.22.0"):
        assert "outside hvdtrain's range 2.15 to 2.21: pip install" in \
            horovod_install.tensorflow_problem(outside)
    assert "TensorFlow is not installed" in horovod_install.tensorflow_problem(None)


def test_setup_horovod_names_a_missing_build_tool_with_the_apt_line():
    # patch among them: every build applies the in-place patch, and a minimal Debian 12 has no
    # patch (make fresh-machine); without the check, the build stopped on a traceback.
    cmake3 = lambda: "3.25.1"
    for tool in ("mpicxx", "g++", "make", "cmake", "patch"):
        problem = horovod_install.tool_problem(lambda name: None if name == tool else name, cmake3)
        assert problem == (f"{tool} not found: Horovod's build needs it (apt-get install "
                           f"libopenmpi-dev openmpi-bin cmake g++ make patch, or your cluster's "
                           f"modules)"), problem
    assert horovod_install.tool_problem(lambda name: name, cmake3) is None   # control: all there


def test_python_range_is_checked_with_the_range_in_one_line():
    for inside in ((3, 11), (3, 12), (3, 13)):
        assert doctor.check_python(inside).ok, inside
    for outside in ((3, 10), (3, 14)):
        check = doctor.check_python(outside)
        assert not check.ok and check.detail == (
            f"{outside[0]}.{outside[1]}: hvdtrain needs Python 3.11 to 3.13; make a venv on one "
            f"of them"), check
    assert doctor.check_python().ok   # this venv's own Python


def test_horovods_source_takes_each_patch_from_its_tensorflow_and_python():
    xla, distutils, in_place = (horovod_patches.XLA_PATCH, horovod_patches.DISTUTILS_PATCH,
                                horovod_patches.IN_PLACE_PATCH)
    names = lambda tensorflow, python: [patch for patch, _ in horovod_patches.source_patches(
        horovod_install.minor(tensorflow), python)]
    assert names("2.15.1", (3, 11)) == [in_place]   # the control: the in-place patch alone
    assert names("2.18.1", (3, 12)) == [distutils, in_place]
    assert names("2.19.1", (3, 11)) == [xla, in_place]
    assert names("2.21.0", (3, 13)) == [xla, distutils, in_place]
    reasons = dict(horovod_patches.source_patches((2, 21), (3, 12)))
    assert reasons[distutils] == " for Python 3.12" and reasons[xla] == " for TensorFlow 2.21"
    for patch in (xla, distutils, in_place):   # each is shipped, and named in NOTICE
        assert (ROOT / "scripts" / "patches" / patch).is_file(), patch
        assert patch in (ROOT / "NOTICE").read_text(), patch
