"""rank_process.end_rank: a finished rank, or one stopped by a user error, skips Python's teardown
of TensorFlow's modules, and loses nothing the usual exit would give: exit handlers run,
buffered output is written, a thread still working is waited for, and a file still open for
writing is written out."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """
import atexit, os, sys, threading, time, types
from hvdtrain.launch import rank_process

out = sys.argv[1]
touch = lambda name: open(f"{out}/{name}", "w").close()
if "tensorflow" in sys.argv:  # loaded, as far as the check can tell; importing it takes seconds
    sys.modules["tensorflow"] = types.ModuleType("tensorflow")
if "thread" in sys.argv:
    threading.Thread(target=lambda: (time.sleep(0.5), touch("thread"))).start()
if "writing" in sys.argv:  # e.g. a writer an error left open: only the teardown writes it out
    unclosed = open(f"{out}/unclosed", "w")
    unclosed.write("held in the buffer")
if "deleted" in sys.argv:  # as Open MPI keeps its shared memory: nothing left to write to
    scratch = open(f"{out}/scratch", "w+")
    os.unlink(f"{out}/scratch")


class TornDown:  # only Python's teardown of this module calls this
    def __init__(self, path):
        self.path = path

    def __del__(self, open=open):  # the module's names may be gone by then
        open(self.path, "w").close()


kept = TornDown(f"{out}/teardown")
atexit.register(touch, "atexit")
sys.stdout.write("buffered, not flushed")
rank_process.end_rank(2 if "error" in sys.argv else 0)
"""


def run_program(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, str(script), str(out), *flags], env=env,
                          capture_output=True, text=True, timeout=60)
    return done, {p.name for p in out.iterdir()}


def test_with_tensorflow_loaded_the_teardown_is_skipped_and_nothing_else(tmp_path):
    done, left = run_program(tmp_path, "tensorflow")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "buffered, not flushed"
    assert left == {"atexit"}             # exit handlers ran; the teardown did not


def test_control_without_tensorflow_the_usual_exit_tears_down(tmp_path):
    done, left = run_program(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "buffered, not flushed"
    assert left == {"atexit", "teardown"}  # so the marker above is sharp


def test_a_thread_still_working_is_waited_for(tmp_path):
    done, left = run_program(tmp_path, "tensorflow", "thread")
    assert done.returncode == 0, done.stderr
    assert left == {"atexit", "teardown", "thread"}


def test_an_error_status_exits_the_same_way(tmp_path):
    done, left = run_program(tmp_path, "tensorflow", "error")
    assert done.returncode == 2, done.stderr
    assert done.stdout == "buffered, not flushed"
    assert left == {"atexit"}


def test_a_file_still_open_for_writing_is_written_out(tmp_path):
    done, left = run_program(tmp_path, "tensorflow", "error", "writing")
    assert done.returncode == 2, done.stderr
    assert left == {"atexit", "teardown", "unclosed"}
    assert (tmp_path / "out/unclosed").read_text() == "held in the buffer"


def test_a_deleted_file_still_open_does_not_hold_the_exit_up(tmp_path):
    done, left = run_program(tmp_path, "tensorflow", "deleted")
    assert done.returncode == 0, done.stderr
    assert left == {"atexit"}
