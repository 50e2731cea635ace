"""The helpers the test files import (``from helpers import ...``; pytest puts tests/ on the path,
see pyproject.toml): launching real jobs (horovodrun --gloo, mpirun, or one
process) so that none can hang the suite, and the checks and data several test files use.

Every job runs in a session of its own with a tag in its environment, which every process it
starts inherits (ranks included, even those a launcher puts in a session of their own, as
horovodrun does): at its time limit, or when the test ends in any other way (an assertion,
pytest-timeout), the job and every process tagged with it are killed, and the output so far
goes with the failure.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from hvdtrain import launchers

BIN = launchers.BIN
TESTS = Path(__file__).parent
ROOT = TESTS.parent   # the checkout
LAUNCHERS = list(launchers.MULTI_RANK)  # the tests' launcher parameter: [mpi], [gloo]
JOB_TAG = "HVDTRAIN_TEST_JOB"    # in the environment of every process a test job starts
_JOB_NUMBERS = itertools.count(1)


def keras_major() -> int:
    """The installed Keras's major version, read from its metadata (no TensorFlow import)."""
    import importlib.metadata
    return int(importlib.metadata.version("keras").split(".")[0])


launcher_env = launchers.launch_env


def launch_command(launcher: str, np_: int, argv: list[str], *, tag_output: bool = False,
                   ) -> list[str]:
    """launchers.launch_command; ``tag_output`` makes mpirun prefix every line with its rank
    (``[1,R]<stdout>:``) as horovodrun always does (``[R]<stdout>:``)."""
    return launchers.launch_command(launcher, np_, argv, tag_output=tag_output)


# ---------------------------------------------------------------------------------------------
# Jobs that cannot outlive their test

class JobTimedOut(AssertionError):
    """A job ran past its time limit; it was killed, with everything it started."""


def tagged_processes(tag: str) -> list[int]:
    """The live processes whose environment carries JOB_TAG=``tag`` (zombies have none)."""
    needle = f"{JOB_TAG}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


class Job:
    """A command started in a session of its own, its output read line by line by a thread,
    so that no read blocks a test past its deadline. Use it as a context manager: leaving the
    block, however, ends every process the job started."""

    def __init__(self, command: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: Path | None = None):
        self.command = list(command)
        self.tag = f"{os.getpid()}.{next(_JOB_NUMBERS)}"
        self.started = time.monotonic()
        self.lines: list[str] = []
        self._fresh: queue.Queue[str | None] = queue.Queue()
        self._at_end = False
        self.proc = subprocess.Popen(
            self.command, cwd=cwd, env={**launcher_env(), **(env or {}), JOB_TAG: self.tag},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self._fresh.put(line)
        self._fresh.put(None)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def tail(self, chars: int = 4000) -> str:
        return self.output[-chars:]

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def next_line(self, deadline: float) -> str | None:
        """The next line of output, or None once the output has ended; at ``deadline``
        (time.monotonic()) the job is ended and JobTimedOut raised."""
        if self._at_end:
            return None
        try:
            line = self._fresh.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            self._time_out("printed nothing new")
        self._at_end = line is None
        return line

    def wait(self, deadline: float) -> int:
        """The job's exit status, once it and its output have ended; JobTimedOut at
        ``deadline``."""
        try:
            status = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._time_out("still running")
        # A rank left behind may still hold the output open: its end ends the read.
        self._reader.join(timeout=max(1.0, min(5.0, deadline - time.monotonic())))
        return status

    def processes(self) -> list[int]:
        """The processes of this job still alive, wherever they were re-parented."""
        return tagged_processes(self.tag)

    def end(self) -> None:
        """SIGKILL to the job's session and to every process tagged with it."""
        for _ in range(50):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            alive = self.processes()
            if not alive:
                break
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        self.proc.wait()
        self._reader.join(timeout=5)
        if not self._reader.is_alive():
            self.proc.stdout.close()

    def _time_out(self, what: str) -> None:
        self.end()
        raise JobTimedOut(f"{' '.join(self.command)}\n{what} after {self.seconds():.0f} s: "
                          f"killed with every process it started; its output so far:\n"
                          f"{self.tail()}") from None

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        running = self.proc.poll() is None or self.processes()
        self.end()
        if kind is not None and not issubclass(kind, JobTimedOut) and running:
            # e.g. pytest-timeout's failure: pytest shows what the test printed
            print(f"job ended by the test's exit ({kind.__name__}) after {self.seconds():.0f} "
                  f"s: {' '.join(self.command)}\nits output so far:\n{self.tail()}")


@dataclass
class Launched:
    returncode: int
    output: str
    seconds: float
    finished_at: float = 0.0        # time.time() when the launcher exited
    leftovers: list[int] = field(default_factory=list)  # processes alive after the launcher


LEFTOVER_GRACE_S = 2.0


def run_job(command: Sequence[str], *, timeout: float = 240, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Launched:
    """Runs ``command`` to its end, at most ``timeout`` seconds (then JobTimedOut, with the
    output so far); returns its status, combined output, seconds and the processes it left
    running (which are killed)."""
    with Job(command, env=env, cwd=cwd) as job:
        status = job.wait(job.started + timeout)
        seconds, finished_at = job.seconds(), time.time()
        grace = time.monotonic() + LEFTOVER_GRACE_S
        while job.processes() and time.monotonic() < grace:
            time.sleep(0.1)
        leftovers = job.processes()
    return Launched(status, job.output, seconds, finished_at, leftovers)


def launch(launcher: str, np_: int, argv: list[str], *, cwd: Path | None = None,
           timeout: float = 240, env: dict[str, str] | None = None,
           tag_output: bool = False) -> Launched:
    """Runs a job of ``np_`` ranks under ``launcher`` to completion (see run_job)."""
    return run_job(launch_command(launcher, np_, argv, tag_output=tag_output), timeout=timeout,
                   env=env, cwd=cwd)


def importable_from(folder: Path) -> dict[str, str]:
    """The environment that lets a job's ranks import modules from ``folder`` (a user's model
    module), in front of the PYTHONPATH the tests run with."""
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def worker(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(TESTS / "multirank_worker.py"), "--out", str(out), *args]


def hvdtrain(*args: str) -> list[str]:
    return [str(BIN / "hvdtrain"), *args]


def convert_digits(src: Path, dst: Path, *args: str, timeout: float
                   ) -> subprocess.CompletedProcess:
    """``hvdtrain data convert SRC DST`` of 8x8 grey digit images, one process (no launcher);
    stdout and stderr apart."""
    return subprocess.run(hvdtrain("data", "convert", str(src), str(dst), "--image-shape",
                                   "8,8,1", *args), env=launcher_env(), capture_output=True,
                          text=True, timeout=timeout)


def launcher_turns(cases: Sequence[str], under_both: Sequence[str]) -> list[tuple[str, str]]:
    """(case, launcher) pairs for a table of cases (bad inputs, kinds of input). What a
    launcher does depends on the path the ranks take, not on the case: ``under_both`` names one
    case per path (every rank finds the error, one rank finds it, the ranks' results gathered,
    ...), run under both launchers. Every other case takes one launcher, in turn: what it
    differs in (a message, a reader) does not depend on the launcher."""
    assert set(under_both) <= set(cases), under_both
    turns = itertools.cycle(LAUNCHERS)
    return [(case, launcher) for case in cases
            for launcher in (LAUNCHERS if case in under_both else [next(turns)])]


# ---------------------------------------------------------------------------------------------
# Checks several test files make

def assert_ok(job: Launched, what: str) -> None:
    assert job.returncode == 0, f"{what} failed ({job.returncode}):\n{job.output[-4000:]}"
    assert not job.leftovers, f"{what}: processes left running {job.leftovers}"


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "hvdtrain: error:" in line]


# A traceback from a rank: horovodrun tags the ranks' lines and adds a traceback of its own.
RANK_TRACEBACK = {"gloo": r"^\[\d+\]<std(out|err)>:Traceback", "mpi": r"Traceback"}
STOPPED_WITHIN_S = 60


def assert_stopped_with_one_line(job: Launched, launcher: str, expected: str) -> str:
    """A user error: one `hvdtrain: error:` line holding ``expected``, exit status 2 on every
    rank (mpirun's own; horovodrun names the ranks' status), no traceback from any rank, every
    process gone, within a minute. Returns the line."""
    errors = error_lines(job.output)
    assert len(errors) == 1, job.output[-4000:]
    assert expected in errors[0], errors[0]
    if launcher == "gloo":
        assert job.returncode != 0 and "exit with status code 2" in job.output, job.output
    else:
        assert job.returncode == 2, (job.returncode, job.output[-4000:])
    assert not re.search(RANK_TRACEBACK[launcher], job.output, re.M), job.output[-4000:]
    assert job.seconds < STOPPED_WITHIN_S and not job.leftovers, (job.seconds, job.leftovers)
    return errors[0]


def weights(path: Path) -> list[np.ndarray]:
    """The arrays a test worker saved (multirank_worker.py), in the model's order."""
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def exported_model(run_dir: Path):
    """The model a run exported to RUN_DIR/model, loaded as hvdtrain predict does (the format
    depends on the stack)."""
    from hvdtrain import distributed as dist
    return dist.load_model(run_dir / "model")


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its content."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def largest_difference(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def relative_distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """|a - b| / |b| over all the weights together (Euclidean norms)."""
    flat = lambda ws: np.concatenate([w.ravel() for w in ws])
    return float(np.linalg.norm(flat(a) - flat(b)) / np.linalg.norm(flat(b)))


# A small, fast, deterministic job for the numerical checks (synthetic-mlp: 266 train and 67
# eval samples).
EXACT = ["--set", "data.num_samples=333", "--set", "run.tensorboard=false",
         "--set", "run.export=false"]


# ---------------------------------------------------------------------------------------------
# TFRecord files whose records tell themselves apart (unit tests and multi-rank tests)

RECORD_SHAPE = (4, 4, 1)


def _example(pixel: int, label: int, shape=RECORD_SHAPE) -> bytes:
    import tensorflow as tf
    image = np.full(shape, pixel, np.uint8)
    return tf.train.Example(features=tf.train.Features(feature={
        "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def write_records(path: Path, pixels, labels=None, shape=RECORD_SHAPE) -> Path:
    """One record per pixel value (the image is filled with it, so it tells records apart)."""
    import tensorflow as tf
    pixels = list(pixels)
    labels = [p % 3 for p in pixels] if labels is None else labels
    with tf.io.TFRecordWriter(str(path)) as writer:
        for pixel, label in zip(pixels, labels):
            writer.write(_example(pixel, label, shape))
    return path


def write_shards(folder: Path, counts, prefix="part") -> list[Path]:
    """Files with ``counts`` records; record pixels are global indices 0, 1, 2, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for i, n in enumerate(counts):
        paths.append(write_records(folder / f"{prefix}-{i:02d}.tfrecord", range(start, start + n)))
        start += n
    return paths


def shard_logged(stream, folder: Path) -> tuple[list[np.ndarray], list[str]]:
    """The inputs of a train stream's first epoch, batch by batch, and the ids its shard log
    wrote for them (the stream built with ``tfdata.SHARD_LOG_ENV`` set to ``folder``)."""
    batches = list(stream.dataset.take(stream.steps_per_epoch).as_numpy_iterator())
    return [x for x, _ in batches], (folder / "rank0.txt").read_text().splitlines()


# ---------------------------------------------------------------------------------------------
# Multi-host runs (test_multihost.py, test_slurm.py) against the same job on one host

# Small and deterministic: the multi-host result must equal the one-host result.
MULTIHOST_TRAIN_ARGS = ["--preset", "digits-mlp", "--epochs", "3",
                        "--set", "run.export=false", "--set", "run.tensorboard=false"]
# Run in a rank's place: writes its host name and address, then runs the rest of its command line.
REPORT_HOST = TESTS / "cluster" / "report_host.sh"
COMPARED = ["final_train_loss", "final_train_accuracy", "final_eval_loss",
            "final_eval_accuracy", "eval_samples", "steps_per_epoch", "world_size"]


def one_host_summary(launcher: str, ranks: int, tmp_path: Path,
                     train_args: list[str] = MULTIHOST_TRAIN_ARGS) -> dict:
    run_dir = tmp_path / "single"
    done = launch(launcher, ranks, hvdtrain("train", *train_args, "--run-dir", str(run_dir)))
    assert_ok(done, "the job on one host")
    return json.loads((run_dir / "summary.json").read_text())


def assert_same_training(multi: dict, single: dict) -> None:
    for key in COMPARED:
        assert multi[key] == pytest.approx(single[key], rel=1e-6, abs=1e-9), key


# ---------------------------------------------------------------------------------------------
# Tests that must run where the suite is expected to run everything

def expects_root_tests() -> bool:
    """True where a skip of the root-only tests (tmpfs and read-only mounts, network namespaces,
    the multi-host and SLURM clusters) would hide coverage: CI as root, unless
    HVDTRAIN_EXPECT_ROOT_TESTS=0; HVDTRAIN_EXPECT_ROOT_TESTS=1 asks for it anywhere."""
    asked = os.environ.get("HVDTRAIN_EXPECT_ROOT_TESTS", "")
    if asked:
        return asked not in ("0", "false", "no")
    return os.environ.get("CI", "").lower() not in ("", "0", "false") and os.geteuid() == 0


def skip_unless_optional(reason: str) -> None:
    """Skips with ``reason``, or fails where these tests are expected to run (CI as root)."""
    if expects_root_tests():
        pytest.fail(f"expected to run here (CI as root, or HVDTRAIN_EXPECT_ROOT_TESTS=1) but "
                    f"cannot: {reason}", pytrace=False)
    pytest.skip(reason)


