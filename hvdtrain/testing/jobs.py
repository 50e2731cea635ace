"""Jobs that cannot outlive their caller: the one runner of hvdtrain's tests and benchmarks.

A job is a command started in a session of its own with a tag in its environment, which every
process it starts inherits (ranks included, even those a launcher puts in a session of their
own, as horovodrun does). At its time limit, or when its ``with`` block ends in any other way
(an assertion, pytest-timeout, Ctrl-C in ``hvdtrain bench``), the job and every process tagged
with it are killed, and its output so far goes with the failure. Its output is read line by
line by a thread, so that no read blocks past a deadline and no pipe fills up.
"""
from __future__ import annotations

import itertools
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from hvdtrain.launch import launchers

JOB_TAG = "HVDTRAIN_JOB"    # in the environment of every process a job starts
_JOB_NUMBERS = itertools.count(1)



class JobTimedOut(AssertionError):
    """A job ran past its time limit; it was killed, with everything it started."""


def tagged_processes(tag: str) -> list[int]:
    """The live processes whose environment carries ``tag`` in JOB_TAG (zombies have none). A
    job started inside another job (a benchmark's ranks under a test's ``hvdtrain bench``)
    carries both tags, so that ending the outer one ends it too."""
    prefix = f"{JOB_TAG}=".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        tags = [v[len(prefix):] for v in environ.split(b"\0") if v.startswith(prefix)]
        if tags and tag.encode() in tags[0].split(b","):
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
        environment = {**launchers.launch_env(), **(env or {})}
        outer = environment.get(JOB_TAG)   # the jobs this one runs inside
        environment[JOB_TAG] = f"{outer},{self.tag}" if outer else self.tag
        self.proc = subprocess.Popen(
            self.command, cwd=cwd, env=environment,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None   # stdout=PIPE
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
        if not self._reader.is_alive() and self.proc.stdout is not None:
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
