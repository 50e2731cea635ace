"""Horovod in this interpreter: is the right build there and do its TensorFlow ops load, and
if not, build it against the TensorFlow installed here (``hvdtrain setup horovod``).

Horovod ships as source only and compiles against one TensorFlow's headers and library: a build
made for another TensorFlow fails at ``import horovod.tensorflow`` (undefined symbols), which is
why pip's isolated build, or a cluster image's Horovod, so often breaks. Nothing here imports
Horovod or TensorFlow: the checks run in a subprocess, so that a crash is reported, not
suffered.
"""
from __future__ import annotations

import concurrent.futures
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from hvdtrain.install import horovod_patches as patches
from hvdtrain.errors import UserError

HOROVOD_VERSION = "0.28.1"
# The TensorFlow range measured to work (README, "Supported TensorFlow"), and its pip pin.
TENSORFLOW_RANGE = ((2, 15), (2, 21))
TENSORFLOW_PIN = "tensorflow-cpu>=2.15,<2.22"
# The Pythons measured (make compat): 3.11 to 3.13 (TensorFlow 2.15, the keras2 stack, has
# wheels up to 3.11 only, and pip finds none for another).
PYTHON_RANGE = ((3, 11), (3, 13))
BUILD_ENV = {  # Horovod's build switches: TensorFlow ops, both controllers, no other framework
    "HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1"}
REBUILD = "hvdtrain setup horovod --rebuild"
# What the probe runs: hvdtrain's distributed layer imports horovod.tensorflow, which loads
# Horovod's TensorFlow ops library into this TensorFlow.
PROBE = "import hvdtrain.distributed"
PROBE_TIMEOUT_S = 120


def distribution_version(name: str) -> str | None:
    """The installed version of the pip distribution ``name``, or None if it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def tensorflow_distribution() -> str | None:
    """The pip distribution that brought TensorFlow (tensorflow, tensorflow-cpu, tf-nightly, a
    vendor's build), without importing it; None without TensorFlow, "unknown" without one."""
    if importlib.util.find_spec("tensorflow") is None:
        return None
    names = importlib.metadata.packages_distributions().get("tensorflow", [])
    return next((name for name in names if distribution_version(name)), "unknown")


def tensorflow_version() -> str | None:
    """The installed TensorFlow's version, whichever distribution brought it."""
    name = tensorflow_distribution()
    return name and (distribution_version(name) or "unknown")


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "2.19.1"; (0, 0) if it has none."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def tensorflow_problem(version: str | None) -> str | None:
    """Why this TensorFlow cannot carry hvdtrain, with what to run, or None."""
    low, high = (".".join(map(str, v)) for v in TENSORFLOW_RANGE)
    install = f"pip install '{TENSORFLOW_PIN}'"
    if version is None:
        return (f"TensorFlow is not installed in {sys.executable}: {install} "
                f"(or tensorflow for GPUs)")
    if not TENSORFLOW_RANGE[0] <= minor(version) <= TENSORFLOW_RANGE[1]:
        return f"TensorFlow {version} is outside hvdtrain's range {low} to {high}: {install}"
    return None


def ops_load_problem(python: str = sys.executable, env: dict[str, str] | None = None) -> str | None:
    """Whether Horovod's TensorFlow ops load in ``python`` (run apart, so a crash is reported):
    None when they do, else one line naming the problem and the command that fixes it."""
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env,
                              timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"import horovod.tensorflow hung for {PROBE_TIMEOUT_S} s: {REBUILD}"
    if done.returncode == 0:
        return None
    return describe_load_failure(done.returncode, done.stderr)


def describe_load_failure(returncode: int, stderr: str) -> str:
    """One line for a failed ``import horovod.tensorflow`` (its exit status and stderr): what
    went wrong and the command that fixes it."""
    if returncode < 0:
        return f"import horovod.tensorflow crashed (signal {-returncode}): {REBUILD}"
    if "No module named 'horovod" in stderr:
        return "Horovod is not installed: hvdtrain setup horovod"
    if "undefined symbol" in stderr:
        symbol = re.search(r"undefined symbol: (\S+)", stderr)
        return (f"Horovod was built against another TensorFlow than this one (undefined symbol "
                f"{symbol[1][:60] if symbol else ''} at import horovod.tensorflow): {REBUILD}")
    if "Extension horovod.tensorflow has not been built" in stderr:
        return (f"Horovod has no TensorFlow ops (horovod/tensorflow/mpi_lib missing: built "
                f"without HOROVOD_WITH_TENSORFLOW): {REBUILD}")
    last = [line for line in stderr.splitlines() if line.strip()][-1:] or ["no output"]
    return f"import horovod.tensorflow failed: {last[0][:200]}: {REBUILD}"


def build_check() -> str:
    """horovodrun --check-build's report (what was compiled in), or '' without horovodrun."""
    horovodrun = shutil.which("horovodrun", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                                 f"{os.environ.get('PATH', '')}")
    if not horovodrun:
        return ""
    done = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    return done.stdout


def missing_parts(report: str) -> list[str]:
    """The pieces hvdtrain needs that a --check-build report does not mark as built."""
    return [part for part in ("TensorFlow", "MPI", "Gloo") if f"[X] {part}" not in report]


def tool_problem(which: Callable[[str], str | None] = shutil.which,
                 cmake_version: Callable[[], str] | None = None) -> str | None:
    """What the build lacks on this machine (Open MPI's compiler wrapper, a C++ compiler, CMake
    3, patch for hvdtrain's patches to Horovod's source), or None."""
    apt = "apt-get install libopenmpi-dev openmpi-bin cmake g++ make patch"
    for tool in ("mpicxx", "g++", "make", "cmake", "patch"):
        if not which(tool):
            return f"{tool} not found: Horovod's build needs it ({apt}, or your cluster's modules)"
    version = (cmake_version or _cmake_version)()
    if not version.startswith("3."):
        # Gloo's cmake_minimum_required is refused by CMake 4.
        return (f"cmake {version} cannot build Horovod's Gloo (it needs CMake 3.x): put a "
                f"CMake 3 first on PATH (pip uninstall cmake, if pip installed CMake 4)")
    return None


def _cmake_version() -> str:
    out = subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout
    found = re.search(r"version (\S+)", out)
    return found[1] if found else "unknown"


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    if subprocess.run(command, env=env, stdin=subprocess.DEVNULL).returncode != 0:
        raise UserError(f"'{' '.join(command[1:])}' failed (its output is above)")


def _extract(archive: tarfile.TarFile, folder: Path) -> None:
    """Unpacks Horovod's source with tarfile's "data" filter where this Python has it (3.11.4
    on); Debian 12's python3 is 3.11.2, where the same refusal of a member that would land
    outside the folder is done here."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(folder, filter="data")
        return
    root = folder.resolve()
    for member in archive.getmembers():
        target = (root / member.name).resolve()
        link = (target.parent / member.linkname).resolve() if member.issym() else root
        if (not target.is_relative_to(root) or not link.is_relative_to(root)
                or member.islnk() or member.isdev()):
            raise UserError(f"Horovod's source archive has an unsafe member: {member.name}")
    archive.extractall(folder)


def build(tensorflow: str, say: Callable[[str], None]) -> None:
    """Downloads Horovod's source, patches it for this TensorFlow and builds it here, in this
    interpreter's environment (no build isolation: it must see this TensorFlow)."""
    missing = [d for d in ("setuptools", "wheel") if not distribution_version(d)]
    if missing:
        _pip("install", "-q", *missing)
    if distribution_version("horovod"):
        _pip("uninstall", "-q", "-y", "horovod")
    with tempfile.TemporaryDirectory(prefix="hvdtrain-horovod-") as tmp:
        _pip("download", "-q", "--no-deps", "--no-binary", ":all:",
             f"horovod=={HOROVOD_VERSION}", "-d", tmp)
        with tarfile.open(next(Path(tmp).glob("horovod-*.tar.gz"))) as archive:
            _extract(archive, Path(tmp))
        source = Path(tmp) / f"horovod-{HOROVOD_VERSION}"
        for patch, why in patches.source_patches(minor(tensorflow), sys.version_info[:2]):
            say(f"patching Horovod's source{why}: {patch}")
            patches.apply(patch, source)
        say(f"building horovod {HOROVOD_VERSION} with TensorFlow {tensorflow}, MPI and Gloo "
            f"(a few minutes)")
        env = {**os.environ, **BUILD_ENV, "MAKEFLAGS": f"-j{os.cpu_count() or 1}"}
        _pip("install", "-q", "--no-build-isolation", "--no-cache-dir", str(source), env=env)


def setup_horovod(*, rebuild: bool = False, dry_run: bool = False,
                  say: Callable[[str], None] = print) -> int:
    """``hvdtrain setup horovod``: nothing is rebuilt when Horovod {HOROVOD_VERSION} is
    installed and its TensorFlow ops load here (unless ``rebuild``)."""
    tensorflow = tensorflow_version()
    problem = tensorflow_problem(tensorflow)
    if problem:
        raise UserError(problem)
    assert tensorflow is not None  # tensorflow_problem refuses a missing TensorFlow
    installed = distribution_version("horovod")
    problem = (f"horovod {installed} is installed, hvdtrain needs {HOROVOD_VERSION}"
               if installed and installed != HOROVOD_VERSION else
               "rebuild asked for" if rebuild else working_problem())
    if not problem:
        applied = not dry_run and patches.patch_launcher()
        say(f"horovod {installed} is built for TensorFlow {tensorflow} with MPI and Gloo and "
            f"its ops load: nothing to build"
            f"{' (horovodrun patched)' if applied else ''}")
        if not patches.built_in_place():
            # A working Horovod is not rebuilt unasked: it may be a site's own (a GPU build).
            say(f"  it was built without hvdtrain's {patches.IN_PLACE_PATCH} (a gradient tensor "
                f"all-reduced into a new buffer, not in place): {REBUILD} takes it")
        return 0
    say(f"horovod needs a build: {problem}")
    if dry_run:
        return 1
    problem = tool_problem()
    if problem:
        raise UserError(problem)
    build(tensorflow, say)
    patches.patch_launcher()
    problem = working_problem()
    if problem:
        raise UserError(f"horovod {HOROVOD_VERSION} was built but does not work: {problem}")
    say(f"horovod {HOROVOD_VERSION} built for TensorFlow {tensorflow} with MPI and Gloo; "
        f"check it with: hvdtrain doctor")
    return 0


def working_problem() -> str | None:
    """Why the installed Horovod does not work here (its TensorFlow ops do not load, or it was
    built without a part hvdtrain needs), or None. The two checks each start a process that
    takes seconds, so they run side by side."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        ops, report = pool.submit(ops_load_problem), pool.submit(build_check)
        return ops.result() or _missing_parts_problem(report.result())


def _missing_parts_problem(report: str) -> str | None:
    missing = missing_parts(report)
    return f"built without {', '.join(missing)}: {REBUILD}" if missing else None
