"""``hvdtrain doctor --report``'s block (doctor_report.block) from given checks, facts and
environment, without launching anything: the machine's fields hold this machine's values, the
settings shown are those set, the block is fenced for an issue. test_doctor.py runs the whole
report on the healthy venv."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
from pathlib import Path

import numpy
import pytest

import hvdtrain
from hvdtrain import version
from hvdtrain.install import doctor_report, horovod_install, horovod_patches
from hvdtrain.install.doctor_report import Check
from test_doctor import missing_fields, report_fields

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

# horovodrun --check-build's output for hvdtrain's build (TensorFlow, MPI and Gloo only), as
# Horovod prints it: PyTorch marked because horovod.torch imports without its library.
CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""
FACTS = {"tensorflow": "2.21.0", "keras": "3.15.1", "check_build": CHECK_BUILD}
SET = {"TF_CPP_MIN_LOG_LEVEL": "2", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1",
       "OMP_NUM_THREADS": "1", "HOME": "/home/u", "TFX": "not a TF_ setting"}


@pytest.fixture(scope="module")
def reports() -> dict[str, str]:
    """The block with SET's settings and with none (each runs ompi_info, reads Horovod's files)."""
    return {name: doctor_report.block([Check("python", True, "3.11")], FACTS, environ)
            for name, environ in (("set", SET), ("none", {}))}


def test_every_field_in_order_fenced_as_markdown_between_the_markers(reports):
    block = reports["set"]
    lines = block.splitlines()
    assert lines[:2] == [doctor_report.BEGIN, "```"] and lines[-2:] == ["```", doctor_report.END]
    assert missing_fields(block) == [] and list(report_fields(block)) == list(doctor_report.FIELDS)
    # Control: without its fence lines skipped, the parse would name "```" a field.
    assert "```" not in report_fields(block)


def test_the_versions_numpy_hvdtrain_and_tensorflows_distribution(reports):
    fields = report_fields(reports["none"])
    assert fields["numpy"] == numpy.__version__   # Horovod 0.28.1 was written for numpy < 2
    assert fields["hvdtrain"] == f"{version.describe()} at {Path(hvdtrain.__file__).parent}"
    distribution = fields["tensorflow dist"]
    assert distribution in importlib.metadata.packages_distributions()["tensorflow"]
    assert importlib.metadata.version(distribution) == horovod_install.tensorflow_version()


def test_the_machine_os_cpus_affinity_and_dev_shm(reports):
    fields = report_fields(reports["none"])
    assert fields["os"] == platform.freedesktop_os_release()["PRETTY_NAME"] != "unknown"
    assert fields["platform"] == platform.platform()
    assert fields["cpus"] == (f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} in this "
                              f"process's affinity)")
    total = shutil.disk_usage("/dev/shm").total / 2 ** 30
    assert fields["/dev/shm"].startswith(f"{total:.1f} GiB, ") and "free" in fields["/dev/shm"]
    assert doctor_report.shm_size("/no/such/shm") == "absent"


def test_the_runtime_settings_shown_are_those_set_and_only_those(reports):
    block = reports["set"]
    shown = ["CUDA_VISIBLE_DEVICES=0,1", "NCCL_DEBUG=INFO", "OMP_NUM_THREADS=1",
             "TF_CPP_MIN_LOG_LEVEL=2"]
    start = block.index("TF/NCCL/CUDA/OMP")
    listed = [line[doctor_report.WIDTH:] for line in block[start:].splitlines()[:len(shown)]]
    assert listed == shown
    assert "HOME=" not in block and "TFX=" not in block
    # Control: none set.
    assert report_fields(reports["none"])["TF/NCCL/CUDA/OMP"] == "none"


def test_the_build_line_keeps_frameworks_and_controllers_without_pytorch(reports):
    block = reports["none"]
    assert report_fields(block)["horovod build"] == (
        "frameworks: TensorFlow; controllers: MPI, Gloo; tensor ops: MPI, Gloo "
        "(horovodrun --check-build)")
    assert "PyTorch" not in block and "MXNet" not in block


def test_the_patches_are_read_from_the_lines_each_adds(tmp_path, reports):
    mpi_ops = tmp_path / horovod_patches.IN_PLACE_MARKER[0]
    util = tmp_path / "horovod" / "common" / "util.py"
    mpi_ops.parent.mkdir(parents=True)
    util.parent.mkdir(parents=True)
    js_run = tmp_path / horovod_patches.DISTUTILS_MARKER[0]
    js_run.parent.mkdir(parents=True)
    mpi_ops.write_text("def _allreduce(): pass\n")
    util.write_text("def _check_extension_lambda(): pass\n")
    js_run.write_text("from distutils.spawn import find_executable\n")
    assert horovod_patches.applied_patches(tmp_path) == []   # the control: unpatched
    mpi_ops.write_text(f"# {horovod_patches.IN_PLACE_MARKER[1]}\n")
    util.write_text("\n".join(marker for _, marker in horovod_patches.LAUNCHER_PATCHES))
    js_run.write_text(f"# {horovod_patches.DISTUTILS_MARKER[1]}\n")
    assert horovod_patches.applied_patches(tmp_path) == [
        horovod_patches.IN_PLACE_PATCH, horovod_patches.DISTUTILS_PATCH,
        *(p for p, _ in horovod_patches.LAUNCHER_PATCHES)]
    # This venv's Horovod, as the report names it (the in-place patch: see doctor's check).
    named = report_fields(reports["none"])["horovod patches"]
    assert ("allreduce-in-place" in named) == horovod_patches.built_in_place()
    assert ("fast-build-check" in named) == (
        horovod_patches.LAUNCHER_PATCH in horovod_patches.applied_patches())
