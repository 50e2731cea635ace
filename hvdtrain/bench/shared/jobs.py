"""Running a measured job to its end: hvdtrain.testing.jobs, the runner the tests use too (a
session of its own; at its time limit or an interrupt, every process it started is ended), with
a failure as BenchError, the end of the job's output in its message."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from hvdtrain.testing import jobs


class BenchError(RuntimeError):
    """A measured job failed: the message carries the end of its output."""


def tail(output: str, lines: int = 25) -> str:
    """The last ``lines`` lines of a job's output."""
    return "\n".join(output.splitlines()[-lines:])


def run_job(command: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = 600, what: str = "job") -> str:
    """Runs a measured job to the end; its output, or BenchError with the last lines of it
    (past ``timeout``, the job and everything it started are killed first)."""
    try:
        done = jobs.run_job(command, env=dict(env or {}), timeout=timeout)
    except jobs.JobTimedOut as e:
        raise BenchError(f"{what} took longer than {timeout:.0f}s: {' '.join(command)}") from e
    if done.returncode != 0:
        raise BenchError(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n"
                         f"{tail(done.output)}")
    return done.output


def read_json_output(path: Path, what: str, output: str) -> Any:
    """The JSON a job wrote to ``path``; BenchError naming ``what``, with the tail of the job's
    ``output``, if it wrote none."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise BenchError(f"{what} wrote no result to {path}\n{tail(output)}") from None
