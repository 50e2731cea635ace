"""``hvdtrain bench network --quick`` end to end, and its teardown: two namespace hosts on a link
shaped by tc, hvdtrain's 2-rank job on one host and across the link, and afterwards no namespace
or link of the run left, also when a rank on host2 is killed mid-run.

Each check has its control: the leftover check finds a namespace left on purpose under the run's
name, and the run's own namespaces while it runs; the achieved throughput is held below the
setting, which the same link unshaped exceeds many times over.

Skipped, with the reason, where namespaces cannot be made (see test_multihost.py).
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import hvdtrain, launcher_env, skip_unless_optional
from hvdtrain.bench.shared import link_probe
from hvdtrain.testing import netns_cluster
from hvdtrain.testing.jobs import Job
from hvdtrain.testing.netns_cluster import NetnsCluster, leftovers

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

SPEED_GBIT = 0.5
QUICK = ["bench", "network", "--quick", "--systems", "hvdtrain", "--steps", "2"]


@pytest.fixture(autouse=True)
def namespaces_can_be_made():
    reason = netns_cluster.unavailable_reason()
    if reason:
        skip_unless_optional(f"no namespace hosts on this machine: {reason}")
    yield
    netns_cluster.remove_stale()   # a bench the test killed (SIGKILL) could not tear down


def bench_network(out: Path, *extra: str) -> Job:
    """The bench as a job of its own: its namespaces are named after its process id."""
    return Job(hvdtrain(*QUICK, "--speeds", str(SPEED_GBIT), "--out", str(out), *extra),
               env=launcher_env())


def wait_for(check, job: Job, what: str, timeout: float = 120):
    """``check()``'s first true value, polled while ``job`` runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.proc.poll() is None:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} never seen; the bench's output:\n{job.tail()}")


def test_bench_network_quick_measures_the_link_and_leaves_nothing(tmp_path):
    with bench_network(tmp_path / "out") as job:
        tag = str(job.proc.pid)
        # Control: while it runs, the check sees the run's namespaces.
        seen = wait_for(lambda: [n for n in leftovers(tag) if n.endswith("h2")], job,
                        "the run's host2")
        assert seen == [f"hvdt{tag}h2"]
        status = job.wait(time.monotonic() + 240)
    assert status == 0, job.tail()
    assert leftovers(tag) == [] and job.processes() == []
    result = json.loads((tmp_path / "out" / "network.json").read_text())
    assert (tmp_path / "out" / "network.md").read_text().count("Gbit/s") >= 2
    [link] = result["links"]
    assert link["gbit_per_s"] == SPEED_GBIT
    # The link was shaped: one TCP stream moved at most the setting (tbf's bucket allows a
    # little over it in a short probe), and not nothing.
    assert 0.3 * SPEED_GBIT < link["achieved_gbit_per_s"]["median"] <= 1.1 * SPEED_GBIT
    # Both ways at once, each direction is held to the setting too (tbf shapes each host's
    # egress), and the projection reads that figure.
    both = link["both_ways_gbit_per_s"]["median"]
    assert 0.2 * SPEED_GBIT < both <= 1.1 * SPEED_GBIT
    assert link["projection"]["hvdtrain"]["transfer_s"]["median"] > 0
    hvd = link["systems"]["hvdtrain"]
    assert hvd["samples_per_sec"]["median"] > 0 and hvd["efficiency"]["median"] > 0
    assert result["one_host"]["hvdtrain"]["samples_per_sec"]["median"] > 0
    assert result["load_average_before_each_round"] and len(result["rounds"]) == 1

    # Control for the leftover check: a namespace left under the run's name is found.
    subprocess.run(["ip", "netns", "add", f"hvdt{tag}h1"], check=True)
    try:
        assert leftovers(tag) == [f"hvdt{tag}h1"]
    finally:
        subprocess.run(["ip", "netns", "del", f"hvdt{tag}h1"], check=True)


def test_control_the_same_link_unshaped_moves_far_more_than_the_setting(tmp_path):
    with NetnsCluster(hosts=2, workdir=tmp_path, ssh=False) as cluster:
        unshaped = link_probe.measure(cluster, 0.5)["achieved_gbit_per_s"]
    assert unshaped > 2 * SPEED_GBIT


def rank_on_host2(tag: str) -> int | None:
    """A training rank running inside the run's host2, if one has started."""
    listed = subprocess.run(["ip", "netns", "pids", f"hvdt{tag}h2"], capture_output=True,
                            text=True).stdout.split()
    for pid in listed:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"trainer_job" in command:
            return int(pid)
    return None


@pytest.mark.fault
@pytest.mark.beside   # a fault's teardown: it mostly waits
def test_a_rank_killed_mid_run_stops_the_bench_and_leaves_nothing(tmp_path):
    with bench_network(tmp_path / "out") as job:
        tag = str(job.proc.pid)
        victim = wait_for(lambda: rank_on_host2(tag), job, "a rank on host2", timeout=180)
        time.sleep(2)   # into its start-up, past the launch
        subprocess.run(["kill", f"-{signal.SIGKILL.value}", str(victim)], check=True)
        status = job.wait(time.monotonic() + 120)
    assert status == 1, job.tail()
    errors = [line for line in job.lines if line.startswith("hvdtrain bench: ")]
    assert len(errors) == 1 and errors[0].startswith(
        "hvdtrain bench: network: hvdtrain on two hosts failed"), job.tail()
    assert "hvdtrain/bench/network.py" not in job.output   # no traceback of the bench's own
    assert leftovers(tag) == [] and job.processes() == []
    assert not (tmp_path / "out" / "network.json").exists()
