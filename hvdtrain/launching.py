"""Starting N ranks from Python: the command line per launcher and the environment every launch
gets. The benchmarks and the tests launch through these; nothing here imports Horovod, and
TensorFlow only when load_tensorflow is called. This is also the one place that sets hvdtrain's
process-wide settings (TensorFlow's log level, Open MPI's run-as-root permission), that loads
TensorFlow for a rank, and that ends a rank's process.
"""
from __future__ import annotations

import atexit
import importlib
import importlib.abc
import os
import shutil
import stat
import sys
import threading
from pathlib import Path
from typing import MutableMapping, Mapping, NoReturn, Sequence

from hvdtrain import placement
from hvdtrain.errors import UserError

BIN = Path(sys.executable).parent  # the venv's horovodrun and hvdtrain, next to this Python
LAUNCHERS = ("mpi", "gloo")

# TensorFlow's C++ start-up chatter (CPU features, missing CUDA), once per process, hides the
# real output.
QUIET_TENSORFLOW = {"TF_CPP_MIN_LOG_LEVEL": "2"}
# Open MPI refuses to start as root (CI, containers) unless told.
ALLOW_RUN_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def quiet_tensorflow(environ: MutableMapping[str, str] = os.environ) -> None:
    """Before TensorFlow loads; a level the user set wins."""
    for name, value in QUIET_TENSORFLOW.items():
        environ.setdefault(name, value)


# Keras 3 imports these as it loads, when they are installed, for its scikit-learn wrappers and
# its plotting helpers; hvdtrain uses neither, and a rank would pay for both imports at every
# start (docs/stacks.md, "A rank's start"). Both are optional to Keras: it goes on without them.
HELD_BACK_WHILE_TENSORFLOW_LOADS = ("sklearn", "matplotlib")


class _HoldBack(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HELD_BACK_WHILE_TENSORFLOW_LOADS:
            raise ModuleNotFoundError(f"{name} is held back while TensorFlow loads", name=name)
        return None  # the usual finders look next


def load_tensorflow() -> None:
    """Imports TensorFlow (Keras with it) for an hvdtrain process: quiet, and without the
    optional imports Keras 3 makes for features hvdtrain does not use. They import as usual
    afterwards (hvdtrain's plots import matplotlib when they draw); only Keras' own wrappers
    and plotting helpers stay without them in this process."""
    quiet_tensorflow()
    if "tensorflow" in sys.modules:
        return
    hold_back = _HoldBack()
    sys.meta_path.insert(0, hold_back)
    try:
        importlib.import_module("tensorflow")
    finally:
        sys.meta_path.remove(hold_back)


def end_rank(status: int = 0) -> NoReturn:
    """Ends a process whose work is done, or that stopped on a user error with its one line
    printed, with ``status`` and without Python's teardown of TensorFlow's modules, which takes
    over a second per process and frees nothing the system would not (figures:
    docs/stacks.md, "A rank's exit").

    What the usual exit does that matters still happens first: the exit handlers (Horovod's
    shutdown, which finalizes MPI and the timeline; logging's flush) and the flush of stdout and
    stderr. A process that still runs a thread it would wait for, that loaded mpi4py (which
    finalizes MPI in the teardown itself), or that still holds a file open for writing (an
    error in the middle of training can leave TensorBoard's writer open, and only the teardown
    writes out what it holds) exits the usual way."""
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if "tensorflow" not in sys.modules or others or "mpi4py.MPI" in sys.modules:
        sys.exit(status)
    atexit._run_exitfuncs()  # CPython's own first step of an exit
    if _writing_a_file():
        sys.exit(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to lose
            pass
    os._exit(status)


def _writing_a_file() -> bool:
    """Whether this process holds a file open for writing that the teardown could still write
    to (True where /proc cannot tell)."""
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return True
    for fd in descriptors:
        try:
            target = os.stat(f"/proc/self/fd/{fd}")
            if not stat.S_ISREG(target.st_mode) or target.st_nlink == 0:
                continue  # pipes, sockets, devices, deleted files (MPI's shared memory)
            flags = Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0]
        except (OSError, IndexError):
            continue  # closed since the listing
        if int(flags, 8) & (os.O_WRONLY | os.O_RDWR):
            return True
    return False


def launch_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a launch: the venv first on PATH (every rank must find
    the same horovodrun, hvdtrain and python), TensorFlow quiet, mpirun allowed as root."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    quiet_tensorflow(env)
    env.update(ALLOW_RUN_AS_ROOT)
    env.update(extra or {})
    return env


def launch_command(launcher: str, ranks: int, argv: Sequence[str], *,
                   bind_to_core: bool = False) -> list[str]:
    """The command that starts ``ranks`` copies of ``argv``.

    gloo: ``horovodrun --gloo`` on this host. mpi: ``mpirun``, oversubscribed when there are
    more ranks than cores; ``bind_to_core`` (the benchmarks) binds one core per rank, Open MPI's
    own default for 2 ranks or fewer, made explicit so that every N gets one core per rank.
    single: one process, no launcher.
    """
    if launcher == "single":
        if ranks != 1:
            raise ValueError(f"launcher 'single' runs one process, not {ranks}")
        return list(argv)
    if launcher == "gloo":
        return [str(BIN / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}",
                "--gloo", *argv]
    if launcher == "mpi":
        mpirun = shutil.which("mpirun")
        if not mpirun:
            raise UserError("mpirun not found: run 'make install'")
        if ranks > placement.cores_available()[1]:
            binding = ["--oversubscribe", "--bind-to", "none"]
        else:
            binding = ["--bind-to", "core", "--map-by", "core"] if bind_to_core else []
        return [mpirun, "-np", str(ranks), *binding, *argv]
    raise ValueError(f"unknown launcher {launcher!r}")
