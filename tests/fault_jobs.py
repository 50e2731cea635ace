"""What the fault tests share (tests/multirank/test_faults.py, test_faults_elastic.py,
test_faults_bad_input.py): the quick job they train; a job acted upon once a line of its output
shows (a rank killed, a host added), every read bound by a deadline so that a job that falls
silent fails the test instead of hanging it; finding a rank's process by its environment; and
the run's summary."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from helpers import Job
from hvdtrain.launch import launchers

QUICK = ["--preset", "digits-mlp", "--set", "run.tensorboard=false", "--set", "run.export=false"]


def rank_is(launcher: str, rank: int) -> str:
    """The entry of rank ``rank``'s environment that says its rank under ``launcher``."""
    return f"{launchers.entry(launcher).rank_variable}={rank}"


def rank_pid(job: Job, variable: str, program: str = "bin/hvdtrain") -> int:
    """The pid of the job's rank (a process running ``program``) whose environment holds
    ``variable`` (rank_is: e.g. HOROVOD_RANK=1)."""
    for pid in job.processes():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (program.encode() in cmdline and b"horovodrun" not in cmdline
                and variable.encode() in environ):
            return pid
    raise AssertionError(f"no {program} rank with {variable} in the job:\n{job.tail()}")


def kill_rank(variable: str, program: str = "bin/hvdtrain") -> Callable[[Job], None]:
    """An action for run_and_act: SIGKILL the job's rank with ``variable``."""
    return lambda job: os.kill(rank_pid(job, variable, program), signal.SIGKILL)


@dataclass
class Acted:
    status: int
    output: str
    lines: list[tuple[float, str]]   # (time.monotonic() when it arrived, line)
    acted_at: float
    gone_s: float                    # from the action until no process of the job was left

    def seconds_until(self, pattern: str) -> float:
        """From the action to the first line after it that matches ``pattern``."""
        for at, line in self.lines:
            if at >= self.acted_at and re.search(pattern, line):
                return at - self.acted_at
        raise AssertionError(f"no line matches {pattern!r} after the action:\n{self.output}")


def run_and_act(command: list[str], trigger: str, act: Callable[[Job], None],
                timeout: float = 300, env: dict[str, str] | None = None) -> Acted:
    """Runs ``command``; calls ``act(job)`` once a line matches ``trigger``. Every read is
    bound by the deadline, so a job that falls silent fails the test instead of hanging it."""
    with Job(command, env=env) as job:
        deadline = job.started + timeout
        lines, acted_at = [], None
        while (line := job.next_line(deadline)) is not None:
            lines.append((time.monotonic(), line))
            if acted_at is None and re.search(trigger, line):
                act(job)
                acted_at = time.monotonic()
        status = job.wait(deadline)
        assert acted_at is not None, f"never saw {trigger!r}:\n{job.tail()}"
        while job.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        return Acted(status, job.output, lines, acted_at, time.monotonic() - acted_at)


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
