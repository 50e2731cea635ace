"""Real multi-host runs on one machine: each rank in its own network namespace ("host") with its
own address, host name and SSH server, launched by horovodrun -H (Gloo) and by mpirun with a
hostfile through run_scripts/mpirun_hostfile.sh (MPI), and compared with the same job on one host.

Skipped, with the reason, where namespaces cannot be made (not root, no iproute2 or sshd); under
CI as root that is a failure instead (helpers.skip_unless_optional).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import (BIN, MULTIHOST_TRAIN_ARGS as TRAIN_ARGS, REPORT_HOST, TESTS,
                     assert_same_training, hvdtrain, launcher_env, one_host_summary,
                     skip_unless_optional)
from netns_cluster import NetnsCluster, remove_stale, unavailable_reason

# The cluster is made by the first test (about 20 s); each job runs to 400 s at most.
pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

ROOT = TESTS.parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        skip_unless_optional(f"no multi-host cluster on this machine: {reason}")
    remove_stale()
    with NetnsCluster(hosts=3, workdir=tmp_path_factory.mktemp("cluster")) as made:
        yield made


def run_on_cluster(cluster: NetnsCluster, tmp_path: Path, launcher_argv: list[str],
                   ) -> tuple[dict, dict[int, tuple[str, str]]]:
    """Runs a launcher on host1; returns rank 0's summary.json and each rank's (host, address)."""
    report = tmp_path / "report"
    report.mkdir()
    env = cluster.env({**launcher_env(), "REPORT_DIR": str(report),
                       "REPORT_IFACE": cluster.interface})
    done = cluster.run(launcher_argv, env=env, check=False, cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stdout[-4000:]
    hosts = {int(f.stem.removeprefix("rank")): tuple(f.read_text().split())
             for f in report.glob("rank*.host")}
    return json.loads((tmp_path / "multi" / "summary.json").read_text()), hosts


def test_horovodrun_gloo_across_three_hosts_equals_one_host(cluster, tmp_path):
    hosts = ",".join(f"{name}:1" for name in cluster.names)
    multi, where = run_on_cluster(cluster, tmp_path, [
        str(BIN / "horovodrun"), "-np", "3", "-H", hosts, "--gloo",
        "--network-interface", cluster.interface, str(REPORT_HOST),
        *hvdtrain("train", *TRAIN_ARGS, "--run-dir", str(tmp_path / "multi"))])
    # Each rank ran on its own host: rank r on host r+1, at that namespace's address.
    assert where == {r: (name, address) for r, (name, address)
                     in enumerate(zip(cluster.names, cluster.addresses))}
    assert multi["controller"] == "gloo" and multi["world_size"] == 3
    assert multi["final_eval_accuracy"] >= 0.85  # it learned (3 epochs, global batch 96)
    assert_same_training(multi, one_host_summary("gloo", 3, tmp_path))


def test_mpirun_hostfile_across_two_hosts_equals_one_host(cluster, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two hosts, one slot each\nhost1 slots=1\nhost2 slots=1\n")
    multi, where = run_on_cluster(cluster, tmp_path, [
        str(ROOT / "run_scripts" / "mpirun_hostfile.sh"), "-f", str(hostfile),
        "-i", cluster.interface, "-x", "REPORT_DIR", "-x", "REPORT_IFACE",
        "-p", f"{REPORT_HOST} {BIN / 'hvdtrain'} train",
        "--", *TRAIN_ARGS, "--run-dir", str(tmp_path / "multi")])
    assert where == {0: (cluster.names[0], cluster.addresses[0]),
                     1: (cluster.names[1], cluster.addresses[1])}
    assert multi["controller"] == "mpi" and multi["world_size"] == 2
    assert_same_training(multi, one_host_summary("mpi", 2, tmp_path))


def test_gloo_across_hosts_whose_names_resolve_to_loopback_fails_clearly(cluster, tmp_path):
    """The trap of Debian's "127.0.1.1 hostname": a clear line, not a Gloo abort."""
    good = cluster.hosts_file.read_text()
    cluster.hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
        f"127.0.1.1 {name}\n" for name in cluster.names))
    try:
        done = cluster.run([
            str(BIN / "horovodrun"), "-np", "2", "-H",
            f"{cluster.addresses[0]}:1,{cluster.addresses[1]}:1", "--gloo",
            "--network-interface", cluster.interface,
            *hvdtrain("train", *TRAIN_ARGS, "--run-dir", str(tmp_path / "run"))],
            env=cluster.env(launcher_env()), check=False, cwd=tmp_path, timeout=120)
    finally:
        cluster.hosts_file.write_text(good)
    assert done.returncode != 0
    # Each rank finds it on its own host, before Horovod starts; the first to stop ends the job,
    # so the line names that rank's host, whichever it is.
    assert any(f"hvdtrain: error: this host's name '{name}' resolves to 127.0.1.1" in done.stdout
               for name in cluster.names[:2]), done.stdout
    assert "gloo::IoException" not in done.stdout
    assert not (tmp_path / "run").exists()
