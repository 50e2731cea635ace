"""A rank's process, from its start to its end: the process-wide settings hvdtrain makes
(TensorFlow's log level), TensorFlow's import for a rank (without Keras' optional extras, and
without the start-up lines TensorFlow 2.21 prints past its log level), and
the rank's exit (without Python's teardown of TensorFlow). Nothing here imports Horovod, and
TensorFlow only when load_tensorflow is called. The command lines that start ranks are
launchers.py's.
"""
from __future__ import annotations

import atexit
import importlib
import importlib.abc
import contextlib
import gc
import os
import re
import stat
import sys
import threading
from pathlib import Path
from typing import Iterator, MutableMapping, NoReturn

# TensorFlow's C++ start-up chatter (CPU features, missing CUDA), once per process, hides the
# real output.
QUIET_TENSORFLOW = {"TF_CPP_MIN_LOG_LEVEL": "2"}


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


# TensorFlow 2.21 logs its start-up (oneDNN, CPU features) through absl, which writes every
# line to stderr until absl::InitializeLog() runs and reads no TF_CPP_MIN_LOG_LEVEL: its lines
# below that level, and absl's notice about them, are dropped while TensorFlow loads. A line:
# "I0000 00:00:1795606731.446845   11120 port.cc:153] oneDNN custom operations are on. ..."
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ [^\]\s]+:\d+\] ")
_ABSL_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
_ABSL_NOTICE = (b"WARNING: All log messages before absl::InitializeLog() is called are written "
                b"to STDERR")
_CONTINUED = b"To enable the following instructions: "  # the CPU-features message's second line


def below_log_level(lines: list[bytes], min_level: int, previous: bool = False) -> list[bool]:
    """For each line TensorFlow's import wrote to stderr: whether it is absl's chatter below
    ``min_level`` (TF_CPP_MIN_LOG_LEVEL: 0 info, 1 warnings, 2 errors), to be dropped. Anything
    else (Python's warnings, tracebacks, lines at or above the level) is kept. ``previous``:
    whether the line before ``lines`` was dropped (a message's second line follows it)."""
    dropped = []
    for line in lines:
        match = _ABSL_LINE.match(line)
        if match:
            drop = _ABSL_SEVERITY[match.group(1)] < min_level
        elif line.rstrip(b"\r\n") == _ABSL_NOTICE:
            drop = min_level > 0
        else:
            drop = previous and line.startswith(_CONTINUED)
        dropped.append(drop)
        previous = drop
    return dropped


@contextlib.contextmanager
def tensorflow_chatter_dropped(min_level: int) -> Iterator[None]:
    """Within: what the process writes to stderr (file descriptor 2, C++ included) passes
    through a thread that drops ``below_log_level`` lines and forwards the rest at once."""
    sys.stderr.flush()
    forward_to = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        pending, previous = b"", False
        while chunk := os.read(read_end, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            lines = [line + b"\n" for line in lines]
            drops = below_log_level(lines, min_level, previous)
            previous = drops[-1] if drops else previous
            os.write(forward_to, b"".join(line for line, drop in zip(lines, drops) if not drop))
        os.write(forward_to, pending)
        os.close(read_end)

    thread = threading.Thread(target=forward, name="hvdtrain-stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(forward_to, 2)  # closes the pipe's last write end: the thread reads to its end
        thread.join(timeout=5)
        if not thread.is_alive():  # else a child holds the pipe: leave the thread its target
            os.close(forward_to)


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
    # Python's cyclic garbage collector runs again and again while TensorFlow's thousands of
    # modules load, finding next to nothing (docs/stacks.md, "A rank's start"). It is off for
    # the import, and what the import made, which lives as long as the process, is moved out of
    # its sight (gc.freeze) so later collections skip it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") or 0)
        with tensorflow_chatter_dropped(level):
            importlib.import_module("tensorflow")
    finally:
        sys.meta_path.remove(hold_back)
        gc.freeze()
        if collecting:
            gc.enable()


def whole_lines() -> None:
    """stdout and stderr written a whole line at a time. Under PYTHONUNBUFFERED (set by many
    images and by horovodrun --gloo) print() writes its text and then its newline, and mpirun
    --tag-output tags each write it reads: an epoch line then ended with the next line's tag.
    Line buffering keeps every line on time, in one write. (One print() of several lines still
    writes the last newline apart: print them a line at a time.)"""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:  # a replaced stream (pytest's capture) may have none
            reconfigure(line_buffering=True, write_through=False)


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

