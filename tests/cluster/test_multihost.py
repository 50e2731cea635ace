"""Real multi-host runs on one machine: each rank in its own network namespace ("host") with its
own address, host name and SSH server, launched by horovodrun -H (Gloo) and by mpirun with a
hostfile through run_scripts/mpirun_hostfile.sh (MPI), and compared with the same job on one host.

Skipped, with the reason, where namespaces cannot be made (not root, no iproute2 or sshd); under
CI as root that is a failure instead (helpers.skip_unless_optional).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import (BIN, MULTIHOST_TRAIN_ARGS as TRAIN_ARGS, REPORT_HOST, TESTS, assert_ok,
                     assert_same_training, hvdtrain, largest_difference, launch, launcher_env,
                     one_host_summary, weights)
from hvdtrain.bench.shared.timeline import read_timeline, tensor_names
from hvdtrain.commands import k8s, trainjob
from hvdtrain.testing.netns_cluster import NetnsCluster

# The cluster is made by the first test (about 20 s); each job runs to 400 s at most.
pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

ROOT = TESTS.parent


CLUSTER = NetnsCluster   # conftest's `cluster`
ONE_HOST = ("mpi", 2, TRAIN_ARGS)   # conftest's `one_host`: two tests compare with it


def run_on_cluster(cluster: NetnsCluster, tmp_path: Path, launcher_argv: list[str],
                   extra_env: dict[str, str] | None = None,
                   ) -> tuple[dict, dict[int, tuple[str, str]]]:
    """Runs a launcher on host1; returns rank 0's summary.json and each rank's (host, address)."""
    report = tmp_path / "report"
    report.mkdir()
    env = cluster.env({**launcher_env(extra_env), "REPORT_DIR": str(report),
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


def two_host_hostfile(tmp_path: Path) -> Path:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two hosts, one slot each\nhost1 slots=1\nhost2 slots=1\n")
    return hostfile


def test_mpirun_hostfile_across_two_hosts_equals_one_host(cluster, tmp_path, one_host):
    hostfile = two_host_hostfile(tmp_path)
    multi, where = run_on_cluster(cluster, tmp_path, [
        str(ROOT / "run_scripts" / "mpirun_hostfile.sh"), "-f", str(hostfile),
        "-i", cluster.interface, "-x", "REPORT_DIR", "-x", "REPORT_IFACE",
        "-p", f"{REPORT_HOST} {BIN / 'hvdtrain'} train",
        "--", *TRAIN_ARGS, "--run-dir", str(tmp_path / "multi")])
    assert where == {0: (cluster.names[0], cluster.addresses[0]),
                     1: (cluster.names[1], cluster.addresses[1])}
    assert multi["controller"] == "mpi" and multi["world_size"] == 2
    assert_same_training(multi, one_host)
    # horovod.bucket_mb's auto: buckets across hosts, one all-reduce on one host.
    assert (multi["bucket_mb_in_force"], one_host["bucket_mb_in_force"]) == (2, 0)


# A user's own fit script on hvdtrain's library, default options, with 4.4 MB of gradients: over
# two of horovod.bucket_mb's auto buckets. Rank 0 writes Horovod's timeline (HOROVOD_TIMELINE).
WIDE_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
from hvdtrain import distributed as dist

world = dist.init()
tf.keras.utils.set_random_seed(0)   # rank 0's initial weights alike in both runs
rng = np.random.default_rng(0)
x, y = rng.normal(size=(256, 64)).astype("float32"), rng.integers(0, 10, 256)
data = tf.data.Dataset.from_tensor_slices((x, y)).shard(world.size, world.rank).batch(16)
model = tf.keras.Sequential([tf.keras.Input((64,)),
                             tf.keras.layers.Dense(1024, activation="relu"),
                             tf.keras.layers.Dense(1024, activation="relu"),
                             tf.keras.layers.Dense(10)])
model.compile(dist.distributed_optimizer(tf.keras.optimizers.SGD(0.01)),
              tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
model.fit(data, epochs=1, callbacks=dist.fit_callbacks(), verbose=0)
np.savez(f"{sys.argv[1]}/rank{world.rank}.npz", *model.get_weights())
"""


def gradient_allreduces(timeline: Path) -> list[str]:
    """The names of the gradients' all-reduces in a Horovod timeline (one per bucket)."""
    names = tensor_names(read_timeline(timeline.read_text())).values()
    return sorted({name for name in names if "gradients" in name})


def test_a_library_script_across_two_hosts_reduces_in_auto_buckets(cluster, tmp_path):
    script = tmp_path / "wide.py"
    script.write_text(WIDE_SCRIPT)
    runs = {where: tmp_path / where for where in ("hosts", "one-host")}
    for out in runs.values():
        out.mkdir()
    env = cluster.env(launcher_env({"HOROVOD_TIMELINE": str(runs["hosts"] / "timeline.json")}))
    done = cluster.run([str(ROOT / "run_scripts" / "mpirun_hostfile.sh"), "-f",
                        str(two_host_hostfile(tmp_path)), "-i", cluster.interface,
                        "-p", f"{sys.executable} {script} {runs['hosts']}"],
                       env=env, check=False, cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stdout[-4000:]
    # Control: the same script on one host, where auto is one all-reduce.
    assert_ok(launch("mpi", 2, [sys.executable, str(script), str(runs["one-host"])],
                     env=launcher_env({"HOROVOD_TIMELINE": str(runs["one-host"] /
                                                                "timeline.json")})),
              "the script on one host")
    across, alone = (gradient_allreduces(out / "timeline.json") for out in runs.values())
    assert len(across) == 3 and all("_b" in name for name in across), across
    assert len(alone) == 1 and "_b" not in alone[0], alone
    # The same training: each run's ranks equal to the bit, and both runs alike up to the last
    # bits of TensorFlow's threads (a rank alone on its host computes with both cores).
    hosts, one_host = ([weights(out / f"rank{rank}.npz") for rank in (0, 1)]
                       for out in runs.values())
    assert largest_difference(*hosts) == largest_difference(*one_host) == 0
    assert largest_difference(hosts[0], one_host[0]) < 1e-6


# The Kubeflow MPI Operator's side of an MPIJob, from its source (kubeflow/mpi-operator,
# pkg/controller/mpi_job_controller.go): the hostfile it writes for OpenMPI, one line per worker
# pod ("%s.%s.%s.svc slots=%d": NAME-worker-I, NAME, NAMESPACE, slotsPerWorker), the names its
# headless service makes resolvable, and the environment of the launcher's container.
# Kubeflow Trainer's side of a TrainJob is commands/trainjob.py's (hostfile, launcher_env).
def operator_hostfile(name: str, namespace: str, workers: int, slots: int) -> list[str]:
    return [f"{name}-worker-{i}.{name}.{namespace}.svc slots={slots}" for i in range(workers)]


def operator_launcher_env(hostfile: Path) -> dict[str, str]:
    return {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": str(hostfile),
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10"}


def printed_launcher(job: k8s.Job, form: str) -> tuple[list[str], list[str]]:
    """The launcher's command, and the hostfile its operator gives it."""
    if form == "mpijob":
        spec = k8s.mpijob(job)["spec"]
        container = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        return (container["command"] + container["args"],
                operator_hostfile(job.name, job.namespace, job.workers, spec["slotsPerWorker"]))
    runtime, train = trainjob.documents(job)
    slots = runtime["spec"]["mlPolicy"]["mpi"]["numProcPerNode"]
    return (train["spec"]["trainer"]["command"] + train["spec"]["trainer"]["args"],
            trainjob.hostfile(job.name, job.workers, slots))


@pytest.mark.parametrize("form", ["mpijob", "trainjob"])
def test_k8s_launcher_line_trains_on_two_worker_hosts_equal_to_one_host(cluster, tmp_path,
                                                                       one_host, form):
    """hvdtrain launch k8s's launcher command (an MPIJob's, a TrainJob's), run on host1 as the
    launcher pod, with its operator's hostfile naming host2 and host3 as the worker pods."""
    name = "multi"   # the run directory: MOUNT/NAME = tmp_path/multi
    job = k8s.Job(name=name, workers=2, slots=1, image="hvdtrain:latest", namespace="ml",
                  interface=cluster.interface, mount=str(tmp_path), train_args=tuple(TRAIN_ARGS))
    line, lines = printed_launcher(job, form)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("\n".join(lines) + "\n")
    env = (operator_launcher_env(hostfile) if form == "mpijob"
           else trainjob.launcher_env(str(hostfile), job.slots))
    line = [str(hostfile) if arg == k8s.OPERATOR_HOSTFILE else arg for arg in line]
    # The printed line, with report_host.sh in each rank's place to see which host it ran on.
    at = line.index("--")
    line[at:at] = ["-x", "REPORT_DIR", "-x", "REPORT_IFACE", "-p", f"{REPORT_HOST} hvdtrain train"]
    pods = {row.split()[0]: worker for worker, row in enumerate(lines, start=1)}
    with cluster.more_names(pods):
        multi, where = run_on_cluster(cluster, tmp_path, line, env)
    assert where == {0: (cluster.names[1], cluster.addresses[1]),
                     1: (cluster.names[2], cluster.addresses[2])}
    assert multi["controller"] == "mpi" and multi["world_size"] == 2
    assert_same_training(multi, one_host)


# Addresses that mean every interface of a host (IPv4, IPv6, both), as ss prints them.
EVERY_INTERFACE = {"0.0.0.0", "*", "[::]"}


def on_every_interface(listeners: set[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The listeners bound to every interface, the clusters' own sshd left out."""
    return sorted(row for row in listeners
                  if row[1].rsplit(":", 1)[0] in EVERY_INTERFACE and row[2] != "sshd")


def test_elastic_script_binds_every_listener_to_the_named_interface(cluster, tmp_path):
    """run_scripts/elastic.sh -i hvd0 across two hosts: horovodrun's rendezvous, Gloo's ranks and
    each worker's notification service listen on hvd0's address alone, while the job trains."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"{cluster.names[0]}:1\n{cluster.names[1]}:1\n")
    scripts = ROOT / "run_scripts"
    with cluster.watching_listeners() as seen:
        multi, _ = run_on_cluster(cluster, tmp_path, [
            str(scripts / "elastic.sh"), "--min-np", "2", "--max-np", "2", "-t", "60",
            "-i", cluster.interface, "-d", f"{scripts / 'discover_hosts.sh'} {hosts}",
            "--", *TRAIN_ARGS, "--run-dir", str(tmp_path / "multi")])
    assert multi["world_size"] == 2 and multi["elastic_world_sizes"] == [2]
    assert on_every_interface(seen) == [], seen
    # The check saw the job: Horovod's listeners on both hosts, at their hvd0 addresses.
    jobs = {(host, address.rsplit(":", 1)[0]) for host, address, process in seen
            if process != "sshd"}
    assert jobs == {(cluster.names[0], cluster.addresses[0]),
                    (cluster.names[1], cluster.addresses[1])}, seen


def test_control_horovods_own_launcher_listens_on_every_interface(cluster, tmp_path):
    """horovodrun itself, given the same interface: its rendezvous binds to every interface,
    which the check above must catch (the ranks only sleep: no TensorFlow)."""
    with cluster.watching_listeners() as seen:
        done = cluster.run([
            str(BIN / "horovodrun"), "-np", "2", "-H", f"{cluster.names[0]}:1,{cluster.names[1]}:1",
            "--gloo", "--network-interface", cluster.interface, "sleep", "3"],
            env=cluster.env(launcher_env()), check=False, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:]
    # ss names no process ("?") for a socket sampled as its owner opens or closes it.
    leaks = on_every_interface(seen)
    assert {host for host, _, _ in leaks} == {cluster.names[0]}, seen
    processes = {process for _, _, process in leaks}
    assert "horovodrun" in processes and processes <= {"horovodrun", "?"}, seen


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
