"""What the figures were measured on: the machine, its load, and the versions of the stack a
virtualenv's interpreter runs (read from its package metadata: nothing imported)."""
from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from hvdtrain.launch import placement
from hvdtrain.bench.shared.jobs import BenchError


def load_average() -> float:
    """The 1-minute load average now: recorded next to figures, since the machine is shared."""
    return os.getloadavg()[0]


def machine(python: str = sys.executable) -> dict[str, Any]:
    """What the figures were measured on: CPU, cores, memory, and the versions of the stack
    measured (the virtualenv of ``python``, which need not be this driver's)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages / 2 ** 30, 1)
    except (ValueError, OSError):
        pass
    versions = dict(stack_versions(python))
    mpirun = shutil.which("mpirun")
    if mpirun:
        try:
            first = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                                   timeout=30).stdout.splitlines()
            versions["mpi"] = first[0] if first else "unknown"
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"cpu": cpu, "cores": placement.cores_available()[1], "memory_gib": memory_gib,
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "versions": versions,
            "load_average_1min_at_start": load,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M UTC")}


STACK_PACKAGES = ("tensorflow-cpu", "tensorflow", "keras", "tf-keras", "horovod", "mpi4py",
                  "numpy")


@functools.lru_cache(maxsize=None)
def stack_versions(python: str = sys.executable) -> dict[str, str]:
    """The versions of STACK_PACKAGES installed in the virtualenv of ``python``, read from its
    package metadata by that interpreter (nothing imported), with the interpreter's path."""
    script = ("import json, sys\nfrom importlib import metadata\nv = {}\n"
              f"for p in {STACK_PACKAGES!r}:\n"
              "    try:\n        v[p] = metadata.version(p)\n"
              "    except metadata.PackageNotFoundError:\n        pass\n"
              "print(json.dumps(v))")
    try:
        found = subprocess.run([python, "-c", script], capture_output=True, text=True,
                               timeout=60, check=True).stdout
        versions = json.loads(found.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        raise BenchError(f"could not read the package versions of {python}: {e}") from None
    return {**versions, "python_executable": python}


def stack_line(versions: Mapping[str, str]) -> str:
    """'TensorFlow 2.20.0, Keras 3.15.1, Horovod 0.28.1' from ``stack_versions``."""
    tf = versions.get("tensorflow-cpu") or versions.get("tensorflow", "?")
    keras = versions.get("keras", "?")
    return f"TensorFlow {tf}, Keras {keras}, Horovod {versions.get('horovod', 'none')}"


def machine_line(info: Mapping[str, Any]) -> str:
    """One line about the machine a result came from (CPU, cores, memory, OS, versions, load,
    date), from ``info`` as machine() gathers it."""
    v = info.get("versions", {})
    return (f"{info['cpu']}, {info['cores']} cores, {info.get('memory_gib')} GiB; "
            f"{info['os']}; Python {info['python']}, {stack_line(v)}, "
            f"{v.get('mpi', 'no MPI')}; "
            f"load {_load(info.get('load_average_1min_at_start'))} at start; "
            f"{info['date_utc']}")


def _load(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else str(value)
