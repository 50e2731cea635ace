"""``hvdtrain doctor --report``: one block to paste into a bug report, in the manner of PyTorch's
``python -m torch.utils.collect_env`` and DeepSpeed's ``ds_report``: the versions (hvdtrain's
commit among them), the machine (OS, CPUs, /dev/shm), Horovod's patches and build, Open MPI's
components, the settings in force, the GPUs, the launcher's environment and the 2-rank
all-reduce's time, each on a line of its own named by FIELDS ("none" where there is nothing),
fenced as Markdown code for an issue. Built from doctor's checks and probe; nothing here imports
TensorFlow or Horovod.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from hvdtrain import version
from hvdtrain.errors import UserError
from hvdtrain.install import horovod_install
from hvdtrain.install.horovod_patches import applied_patches
from hvdtrain.launch import launchers


@dataclass(frozen=True)
class Check:
    """One of doctor's checks (doctor.py makes them; the report quotes them)."""
    name: str
    ok: bool
    detail: str   # what was found; on a failure, the problem and the command that fixes it


# The launchers of doctor's 2-rank smoke tests, in the order it runs them: Gloo first, it needs
# no MPI (like the demo, make demo).
SMOKE_LAUNCHERS = tuple(sorted(launchers.MULTI_RANK, key=lambda name: name != "gloo"))
BEGIN = "----- hvdtrain doctor --report: paste from here -----"
END = "----- to here -----"
FENCE = "```"   # the block between BEGIN and END is Markdown code, ready for an issue
# Every line of the block, in order: the test holds the block to it.
FIELDS = ("hvdtrain", "python", "platform", "os", "cpus", "/dev/shm", "numpy", "tensorflow",
          "tensorflow dist", "keras", "tf_keras", "TF_USE_LEGACY_KERAS", "horovod",
          "horovod patches", "horovod build", "open mpi", "open mpi btl", "open mpi coll",
          "HOROVOD_*", "OMPI_MCA_*", "TF/NCCL/CUDA/OMP", "gpus", "cuda", "cudnn", "nccl",
          "launcher env", *(f"all-reduce {name}" for name in SMOKE_LAUNCHERS), "checks")
# The TensorFlow, NCCL, GPU and thread settings a report shows when set.
RUNTIME_SETTINGS = ("TF_", "NCCL_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
# The variables launchers set: SLURM, PMIx (srun --mpi=pmix, Open MPI's mpirun), Open MPI's
# ranks, the Kubeflow MPI Operator's pods, Kubernetes.
LAUNCHER_PREFIXES = ("SLURM_", "PMIX_", "PMI_", "OMPI_COMM_WORLD_", "K_MPI_JOB_ROLE",
                     "KUBERNETES_")
WIDTH = 21
# For the report's MPI smoke test: Open MPI names the transports (btl), point-to-point layer
# (pml) and collective modules (coll) it selects, on each rank's output.
OPEN_MPI_VERBOSE = {"OMPI_MCA_btl_base_verbose": "10", "OMPI_MCA_pml_base_verbose": "10",
                    "OMPI_MCA_coll_base_verbose": "20"}


# Frameworks hvdtrain's build leaves out (horovod_install.BUILD_ENV). Horovod's check marks
# PyTorch available whenever horovod.torch imports, which it does without its library (it only
# warns "MPI libs are missing"): measured, so the report does not repeat it.
LEFT_OUT = {"frameworks": {"PyTorch", "MXNet"}}


def check_build_parts(report: str) -> str:
    """horovodrun --check-build's report as 'frameworks: ...; controllers: ...; tensor ops:
    ...' (the parts marked [X], less LEFT_OUT), or 'unknown' without one."""
    sections: list[tuple[str, list[str]]] = []
    for line in report.splitlines():
        heading = re.match(r"Available (.+):$", line.strip())
        if heading:
            sections.append((heading[1].lower().replace("tensor operations", "tensor ops"), []))
        elif sections and line.strip().startswith("[X]"):
            name = line.strip()[3:].strip()
            if name not in LEFT_OUT.get(sections[-1][0], set()):
                sections[-1][1].append(name)
    parts = [f"{name}: {', '.join(built) or 'none'}" for name, built in sections]
    return "; ".join(parts) + " (horovodrun --check-build)" if parts else "unknown"


def ompi_components(kind: str, which=shutil.which) -> str:
    """The MCA components of ``kind`` (btl, coll) Open MPI's ompi_info lists, or 'none'."""
    ompi_info = which("ompi_info")
    if not ompi_info:
        return "none (no ompi_info on PATH)"
    listed = subprocess.run([ompi_info], capture_output=True, text=True, timeout=60).stdout
    names = re.findall(rf"^\s*MCA {kind}: (\S+)", listed, re.M)
    return ", ".join(names) if names else "none"


def ompi_selected(output: str) -> dict[str, str]:
    """What Open MPI selected in a job run with OPEN_MPI_VERBOSE, from its output: the btl
    components whose init succeeded, the pml chosen, the coll modules enabled on the job's
    communicators (with their priority: the highest serves a collective first)."""
    started = set(re.findall(r"select: initializing btl component (\w+)", output))
    btl = sorted(started & set(re.findall(r"init of component (\w+) returned success", output)))
    pml = sorted(set(re.findall(r"select: component (\w+) selected", output)))
    enabled = re.findall(r"comm_select: selecting\s+(\w+), priority\s+(\d+), Enabled", output)
    coll = sorted(set(enabled), key=lambda found: (-int(found[1]), found[0]))
    return {"btl": ", ".join(btl), "pml": ", ".join(pml),
            "coll": ", ".join(f"{name} {priority}" for name, priority in coll)}


def _open_mpi(smoke_output: str) -> list[tuple[str, str]]:
    """The btl (and pml) and coll rows: what the MPI smoke test used, then what is there."""
    used = ompi_selected(smoke_output)
    where = "in the 2-rank MPI job here"
    btl, coll = ompi_components("btl"), ompi_components("coll")
    return [("open mpi btl", f"{used['btl']}, pml {used['pml']} ({where}); available: {btl}"
             if used["btl"] else f"available: {btl}"),
            ("open mpi coll", f"{used['coll']} ({where}, by priority); available: {coll}"
             if used["coll"] else f"available: {coll}")]


def settings(environ: Mapping[str, str], prefixes: Sequence[str]) -> list[str]:
    """NAME=value for every variable of ``environ`` that starts with one of ``prefixes``."""
    return [f"{name}={environ[name]}" for name in sorted(environ)
            if name.startswith(tuple(prefixes))] or ["none"]


def all_reduce(found: Sequence[Check], launcher: str) -> str:
    """The timed all-reduce of doctor's 2-rank smoke test under ``launcher``, or why none."""
    check = next((c for c in found if c.name == f"2 ranks {launcher}"), None)
    if check is None:
        return "not run (a check above failed)"
    timed = re.search(r"(\d+ MiB all-reduce [\d.]+ ms)", check.detail)
    return f"2 ranks, {timed[1]} (median of 5)" if timed and check.ok else f"FAIL {check.detail}"


def os_name() -> str:
    """The distribution's PRETTY_NAME (/etc/os-release), or 'unknown'."""
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME", "unknown")
    except OSError:
        return "unknown"


def cpus() -> str:
    """The machine's CPUs and how many of them this process may run on (its affinity: a
    cgroup, taskset or a launcher's binding narrows it)."""
    return f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} in this process's affinity)"


def shm_size(path: str = "/dev/shm") -> str:
    """The size of ``path`` (Open MPI's shared memory between the ranks of a host), or
    'absent'."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return "absent"
    return f"{usage.total / 2 ** 30:.1f} GiB, {usage.free / 2 ** 30:.1f} GiB free"


def horovod_patches() -> str:
    """hvdtrain's patches the installed Horovod took, by the lines they add."""
    if not horovod_install.distribution_version("horovod"):
        return "none (Horovod not installed)"
    try:
        applied = applied_patches()
    except UserError as e:
        return f"unknown: {e}"
    names = [patch.removeprefix(f"horovod-{horovod_install.HOROVOD_VERSION}-")
             .removesuffix(".patch") for patch in applied]
    return f"{', '.join(names) or 'none'} (xla-headers, for TensorFlow 2.19+, leaves no mark)"


def _versions(facts: Mapping, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    import hvdtrain
    mpirun = shutil.which("mpirun")
    open_mpi = next((c.detail for c in facts.get("_checks", []) if c.name == "open mpi"), "")
    return [
        ("hvdtrain", f"{version.describe()} at {Path(hvdtrain.__file__).parent}"),
        ("python", f"{platform.python_version()} {sys.executable}"),
        ("platform", platform.platform()),
        ("os", os_name()), ("cpus", cpus()), ("/dev/shm", shm_size()),
        ("numpy", horovod_install.distribution_version("numpy") or "not installed"),
        ("tensorflow", str(facts.get("tensorflow") or horovod_install.tensorflow_version())),
        ("tensorflow dist", horovod_install.tensorflow_distribution() or "not installed"),
        ("keras", str(facts.get("keras", "unknown"))),
        ("tf_keras", facts.get("tf_keras") or "not installed"),
        ("TF_USE_LEGACY_KERAS", environ.get("TF_USE_LEGACY_KERAS", "unset")),
        ("horovod", horovod_install.distribution_version("horovod") or "not installed"),
        ("horovod patches", horovod_patches()),
        ("horovod build", check_build_parts(facts.get("check_build", ""))),
        ("open mpi", open_mpi or (mpirun or "none (no mpirun on PATH)")),
    ]


def _hardware(facts: Mapping, build: str) -> list[tuple[str, str]]:
    names = facts.get("gpu_names") or []
    nccl = "built into Horovod" if re.search(r"tensor ops: [^;]*NCCL", build) else \
        "none (Horovod built without NCCL)"
    return [("gpus", f"{len(names)}: {', '.join(names)}" if names else "none"),
            ("cuda", facts.get("cuda") or "none"), ("cudnn", facts.get("cudnn") or "none"),
            ("nccl", nccl)]


def block(found: Sequence[Check], facts: Mapping, environ: Mapping[str, str]) -> str:
    """The report: FIELDS in order, one value a line (a field with several continues on
    indented lines), fenced as Markdown code between BEGIN and END."""
    versions = _versions({**facts, "_checks": list(found)}, environ)
    listed = {"HOROVOD_*": settings(environ, ["HOROVOD_"]),
              "OMPI_MCA_*": settings(environ, ["OMPI_MCA_"]),
              "TF/NCCL/CUDA/OMP": settings(environ, RUNTIME_SETTINGS),
              "launcher env": settings(environ, LAUNCHER_PREFIXES)}
    failed = [c.name for c in found if not c.ok]
    rows = [*versions, *_open_mpi(facts.get("smoke mpi", "")),
            *((name, listed[name][0]) for name in ("HOROVOD_*", "OMPI_MCA_*", "TF/NCCL/CUDA/OMP")),
            *_hardware(facts, dict(versions)["horovod build"]),
            ("launcher env", listed["launcher env"][0]),
            *((f"all-reduce {name}", all_reduce(found, name)) for name in SMOKE_LAUNCHERS),
            ("checks", f"FAIL: {', '.join(failed)}" if failed else "every check ok")]
    lines = [BEGIN, FENCE]
    for name, value in rows:
        lines.append(f"{name:<{WIDTH}}{value}")
        lines += [" " * WIDTH + extra for extra in listed.get(name, [])[1:]]
    return "\n".join([*lines, FENCE, END])
