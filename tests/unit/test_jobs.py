"""helpers.py's jobs (hvdtrain.testing.jobs, which hvdtrain bench runs its jobs with too) cannot
hang the suite: a job past its time limit, or silent while a test waits for its next line, is
ended with every process it started, one that left the job's session too (as horovodrun's ranks
do), or a job it started in turn, and the failure carries the job's output so far."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import Job, JobTimedOut, run_job

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks


def leaves_its_session(marker: str) -> list[str]:
    """A job that starts a process in a session of its own, says so, then falls silent."""
    return ["bash", "-c", f"setsid bash -c 'exec -a {marker} sleep 300' & echo started; "
                          f"sleep 300"]


def processes_named(marker: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv0 = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if argv0 == marker.encode():
            found.append(int(entry))
    return found


@pytest.fixture
def marker():
    name = f"hvdtrain-test-{uuid.uuid4().hex[:12]}"
    yield name
    for pid in processes_named(name):   # whatever a failed check left behind
        os.kill(pid, signal.SIGKILL)


def wait_until_started(marker: str) -> None:
    deadline = time.monotonic() + 10
    while not processes_named(marker):
        assert time.monotonic() < deadline, "the job's detached process never started"
        time.sleep(0.05)


def test_a_job_past_its_time_limit_is_ended_with_every_process_it_started(marker):
    started = time.monotonic()
    with pytest.raises(JobTimedOut) as failure:
        run_job(leaves_its_session(marker), timeout=3)
    assert time.monotonic() - started < 15
    assert "still running after" in str(failure.value)
    assert "started" in str(failure.value).rsplit("its output so far:", 1)[1]
    assert processes_named(marker) == []


def test_control_ending_the_session_alone_leaves_the_detached_process(marker):
    # What a timeout that kills only the launcher's session (or only the launcher) does.
    proc = subprocess.Popen(leaves_its_session(marker), stdout=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_until_started(marker)
    finally:   # the session ends however the wait went (the fixture ends the detached one)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    time.sleep(0.5)
    assert processes_named(marker) != []


def test_a_silent_job_fails_the_wait_for_its_next_line_at_the_deadline(marker):
    with Job(leaves_its_session(marker)) as job:
        deadline = time.monotonic() + 3
        assert job.next_line(deadline) == "started\n"
        with pytest.raises(JobTimedOut, match="printed nothing new"):
            job.next_line(deadline)
        assert time.monotonic() - deadline < 10
        assert processes_named(marker) == []


def job_inside_a_job(marker: str, inner_env: str) -> list[str]:
    """A Python job that starts a job of its own (as ``hvdtrain bench`` starts its ranks under a
    test), with ``inner_env`` (Python source) as that job's environment, says so, then waits."""
    inner = ["bash", "-c", f"echo started; exec -a {marker} sleep 300"]
    code = ("import sys, time\nfrom hvdtrain.testing import jobs\n"
            f"job = jobs.Job({inner!r}, env={inner_env})\n"
            "print(job.next_line(time.monotonic() + 60), end='', flush=True)\ntime.sleep(300)\n")
    return [sys.executable, "-c", code]


def test_a_job_started_inside_a_job_is_ended_with_it(marker):
    with Job(job_inside_a_job(marker, "None")) as job:
        assert job.next_line(time.monotonic() + 60) == "started\n"
        wait_until_started(marker)   # "started" comes before the exec that names it
    assert processes_named(marker) == []   # its own session, but the outer job's tag too
    # Control: an inner job that does not carry the outer job's tag outlives it.
    with Job(job_inside_a_job(marker, "{jobs.JOB_TAG: ''}")) as job:
        assert job.next_line(time.monotonic() + 60) == "started\n"
    time.sleep(0.5)
    wait_until_started(marker)   # it outlived the outer job
