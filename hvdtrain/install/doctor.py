"""``hvdtrain doctor``: whether this environment can run a 2-rank job, checked, not listed.

One line per check; a failed check names the problem and the command that fixes it. The
TensorFlow and Horovod checks run in a subprocess (a Horovod built for another TensorFlow can
crash the interpreter that imports it), and the all-reduce smoke test launches 2 real ranks
under each launcher and checks their result. Nothing here imports Horovod or TensorFlow.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

from hvdtrain.install import doctor_report, horovod_install, horovod_patches, shipped
from hvdtrain.install.doctor_report import Check
from hvdtrain.launch import launchers, rank_process, placement

SMOKE_RANKS = 2
SMOKE_TIMEOUT_S = 180
# The probe: facts about TensorFlow first (one JSON line), then Horovod's TensorFlow ops load
# (hvdtrain.distributed imports horovod.tensorflow), so a failure of the second keeps the first.
PROBE = (
    "import json, importlib.metadata as m\n"
    "from hvdtrain.launch import rank_process; rank_process.load_tensorflow()\n"
    "import tensorflow as tf\n"
    "def have(name):\n"
    "    try: return m.version(name)\n"
    "    except m.PackageNotFoundError: return None\n"
    "built = tf.sysconfig.get_build_info()\n"
    "gpus = tf.config.list_physical_devices('GPU')\n"
    "print(json.dumps({'tensorflow': tf.__version__, 'keras': m.version('keras'),\n"
    "                  'tf_keras': have('tf_keras'), 'gpus': len(gpus),\n"
    "                  'gpu_names': [tf.config.experimental.get_device_details(g)\n"
    "                                .get('device_name', g.name) for g in gpus],\n"
    "                  'cuda': built.get('cuda_version'), 'cudnn': built.get('cudnn_version')}),\n"
    "      flush=True)\n"
    f"{horovod_install.PROBE}\n")
SMOKE_RANK = "from hvdtrain.install import doctor; doctor.smoke_rank()"
# The timed all-reduce of the smoke test (--report): 2 MiB of float64, the median of 5.
TIMED_FLOATS, TIMED_REPEATS = 256 * 1024, 5


def smoke_rank() -> None:
    """One rank of the smoke test: all-reduces rank + 1 and prints what it got."""
    rank_process.load_tensorflow()
    import numpy as np

    from hvdtrain import distributed as dist
    world = dist.init(device="cpu")  # Horovod: joins the 2-rank job the launcher started
    # Horovod: a real collective over the launcher's controller; every rank must get the sum.
    total = dist.allreduce_sum(np.array([world.rank + 1.0]))
    times = []
    for _ in range(TIMED_REPEATS):
        started = time.perf_counter()
        dist.allreduce_sum(np.ones(TIMED_FLOATS))  # Horovod: the time a user's report quotes
        times.append(time.perf_counter() - started)
    print("hvdtrain-smoke " + json.dumps({"rank": world.rank, "size": world.size,
                                          "controller": world.controller,
                                          "sum": float(total[0]),
                                          "ms": 1000 * sorted(times)[len(times) // 2]}),
          flush=True)


SMOKE_REPORT = re.compile(r"hvdtrain-smoke (\{[^{}]*\})")


def smoke_problem(output: str, launcher: str, size: int = SMOKE_RANKS) -> str | None:
    """Whether every rank of the job reported the right sum (1 + ... + size) over ``launcher``'s
    controller: None, or the problem in one line."""
    controller = launchers.entry(launcher).controller
    # Found anywhere, not line by line: the launcher forwards the two ranks' output in chunks,
    # which may put both reports on one line.
    reports = [json.loads(report) for report in SMOKE_REPORT.findall(output)]
    expected = size * (size + 1) / 2
    ranks = sorted(r["rank"] for r in reports)
    if ranks != list(range(size)):
        return f"ranks {ranks} reported, expected 0 to {size - 1}"
    wrong = [r for r in reports if r["sum"] != expected or r["size"] != size
             or r["controller"] != controller]
    if wrong:
        return f"wrong all-reduce results {wrong}, expected sum {expected:g} over {launcher}"
    return None


def _run(command: Sequence[str], timeout: float, env: dict[str, str] | None = None
         ) -> tuple[int | None, str]:
    """(status, stdout and stderr) of ``command`` in a session of its own, killed whole at
    ``timeout`` (status None)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate()[0]


def check_python(version: tuple[int, int] | None = None) -> Check:
    """ok on the Pythons hvdtrain is measured on (horovod_install.PYTHON_RANGE); ``version``
    (major, minor) stands in for this interpreter's in tests."""
    low, high = horovod_install.PYTHON_RANGE
    ok = low <= (version or sys.version_info[:2]) <= high
    shown = ".".join(map(str, version)) if version else platform.python_version()
    return Check("python", ok, f"{shown} ({sys.executable})" if ok else
                 f"{shown}: hvdtrain needs Python {low[0]}.{low[1]} to {high[0]}.{high[1]}; "
                 f"make a venv on one of them")


def check_tensorflow() -> Check:
    """ok when TensorFlow is installed in the supported range."""
    version = horovod_install.tensorflow_version()
    problem = horovod_install.tensorflow_problem(version)
    return Check("tensorflow", not problem, problem or f"{version}")


def probe_checks(facts: dict | None = None) -> list[Check]:
    """Keras and its binding, the GPUs (and local rank 0's pin), and Horovod's ops loading;
    what the probe found goes into ``facts`` (doctor --report prints it)."""
    status, output = _run([sys.executable, "-c", PROBE], horovod_install.PROBE_TIMEOUT_S)
    facts_line = next((line for line in output.splitlines() if line.startswith("{")), None)
    if facts_line is None:
        last = ([line for line in output.splitlines() if line.strip()] or ["no output"])[-1]
        reinstall = f"pip install --force-reinstall '{horovod_install.TENSORFLOW_PIN}'"
        return [Check("tensorflow", False, f"import tensorflow failed: {last[:200]}: {reinstall}")]
    found = json.loads(facts_line)
    if facts is not None:
        facts.update(found)
    checks = [check_keras(found["keras"]),
              check_gpus(found["gpus"], placement.given_devices(os.environ))]
    installed = horovod_install.distribution_version("horovod")
    if status == 0:
        unpatched = ("" if horovod_patches.built_in_place() else
                     f"; built without hvdtrain's in-place all-reduce patch: "
                     f"{horovod_install.REBUILD} takes it")
        checks.append(Check("horovod", True, f"{installed}, its TensorFlow ops load{unpatched}"))
    else:
        problem = (horovod_install.describe_load_failure(status, output) if status is not None
                   else f"import horovod.tensorflow hung: {horovod_install.REBUILD}")
        checks.append(Check("horovod", False, problem))
    return checks


def check_keras(version: str) -> Check:
    """ok for Keras ``version`` 2 or 3, naming the binding hvdtrain uses for it."""
    bindings = {"2": "Horovod's own Keras layer (hvdtrain/distributed/keras2.py)",
                "3": "hvdtrain's binding on Horovod's collectives (hvdtrain/distributed/keras3.py)"}
    binding = bindings.get(version.split(".")[0])
    return Check("keras", binding is not None,
                 f"{version}: {binding}" if binding else
                 f"{version}: hvdtrain binds Keras 2 and 3 only: pip install "
                 f"'{horovod_install.TENSORFLOW_PIN}'")


def check_gpus(visible: int, given: str | None = None) -> Check:
    """Always ok: how many GPUs are ``visible`` (``given``: CUDA_VISIBLE_DEVICES) and which one
    local rank 0 would pin."""
    index, problem = placement.choose_gpu(visible, 0, SMOKE_RANKS, "auto", given)
    if not visible:
        return Check("gpus", True, "none visible: ranks run on the CPU")
    if problem:
        return Check("gpus", True, f"{visible} visible; {SMOKE_RANKS} ranks per host: {problem}")
    return Check("gpus", True, f"{visible} visible; local rank 0 pins GPU {index}")


def check_controllers(report: str) -> Check:
    """ok when ``report`` (horovodrun --check-build's output) shows MPI and Gloo built; a FAIL
    when horovodrun is missing (empty report) or either controller is."""
    missing = horovod_install.missing_parts(report)
    if not report:
        return Check("controllers", False, "horovodrun not found next to this Python: "
                                           "hvdtrain setup horovod")
    if missing:
        return Check("controllers", False, f"Horovod built without {', '.join(missing)}: "
                                           f"{horovod_install.REBUILD}")
    return Check("controllers", True, "MPI and Gloo built (horovodrun --check-build)")


def check_open_mpi(which: Callable[[str], str | None] = shutil.which) -> Check:
    """ok when ``which`` finds an mpirun and it is Open MPI's, with its version and path."""
    mpirun = which("mpirun")
    if not mpirun:
        return Check("open mpi", False, f"mpirun not on PATH: {launchers.OPEN_MPI_FIX}")
    first = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                           timeout=30).stdout.splitlines()[:1]
    version = re.search(r"\(Open MPI\) (\S+)", first[0]) if first else None
    if not version:
        return Check("open mpi", False,
                     f"{mpirun} is not Open MPI's ({first}): {launchers.OPEN_MPI_FIX}")
    return Check("open mpi", True, f"{version[1]}, {mpirun}")


def check_smoke(launcher: str, facts: dict | None = None) -> Check:
    """A 2-rank all-reduce under ``launcher`` (a name in launchers.MULTI_RANK): its Check;
    ``facts`` (doctor --report) gets its output, and under MPI Open MPI says what it selected."""
    name = f"2 ranks {launcher}"
    verbose = doctor_report.OPEN_MPI_VERBOSE if facts is not None else {}
    command, env = launchers.prepare(launcher, SMOKE_RANKS, [sys.executable, "-c", SMOKE_RANK],
                                     env=verbose)
    started = time.monotonic()
    status, output = _run(command, SMOKE_TIMEOUT_S, env)
    seconds = time.monotonic() - started
    if facts is not None:
        facts[f"smoke {launcher}"] = output
    if status is None:
        return Check(name, False, f"no result in {SMOKE_TIMEOUT_S} s: {' '.join(command)} hangs "
                                  f"(a firewall between ranks, or a stuck MPI)")
    problem = smoke_problem(output, launcher)
    if status != 0 or problem:
        last = ([line for line in output.splitlines() if line.strip()] or ["no output"])[-1]
        return Check(name, False, f"exit {status}: {problem or last[:200]}: run "
                                  f"'{' '.join(command)}' to see its output")
    timed = max(json.loads(report)["ms"] for report in SMOKE_REPORT.findall(output))
    return Check(name, True, f"every rank all-reduced 1 + 2 = 3 in {seconds:.1f} s; "
                             f"{TIMED_FLOATS * 8 // 1024 ** 2} MiB all-reduce {timed:.2f} ms")


def checks(facts: dict | None = None) -> list[Check]:
    """Every check; the smoke tests only when all else passed (their failure would only echo
    a problem already named, after a wait). ``facts`` gets what the probe found."""
    found = [check_python(), check_tensorflow()]
    if found[-1].ok:
        found += probe_checks(facts)
    if any(check.name == "horovod" and check.ok for check in found):
        # after a failed load it would only echo that failure (nothing looks built)
        build = horovod_install.build_check()
        if facts is not None:
            facts["check_build"] = build
        found.append(check_controllers(build))
    found.append(check_open_mpi())
    if all(check.ok for check in found):
        found += [check_smoke(launcher, facts) for launcher in doctor_report.SMOKE_LAUNCHERS]
    return found


def ready(found: Sequence[Check]) -> bool:
    """Every check passed, the smoke tests among them."""
    return all(c.ok for c in found) and any(c.name.startswith("2 ranks") for c in found)


def report(found: Sequence[Check]) -> str:
    """The lines doctor prints: one per check, then ready or not, then where the docs are."""
    lines = [f"  {'ok' if c.ok else 'FAIL':<5} {c.name:<13} {c.detail}" for c in found]
    lines.append("ready: a 2-rank job works here" if ready(found) else
                 "not ready: fix the FAIL lines above, then run hvdtrain doctor again")
    lines.append(f"docs: {shipped.folder('docs')}")
    return "\n".join(lines)


def run(paste: bool = False) -> int:
    """Runs every check and prints the report (``paste``: the block for a bug report, from
    doctor_report); returns the exit status, 0 when ready, else 1."""
    facts: dict | None = {} if paste else None
    found = checks(facts)
    print(f"hvdtrain doctor ({sys.executable})\n{report(found)}", flush=True)
    if paste:
        print(doctor_report.block(found, facts or {}, os.environ), flush=True)
    return 0 if ready(found) else 1
