"""SLURM for real: `sbatch run_scripts/slurm.sbatch` on a SLURM cluster of three namespaced hosts
(slurm_cluster.py: munged, slurmctld, one slurmd per host), with the ranks started by srun
(PMIx) and by mpirun inside the allocation, each compared with the same job on one host; then
scancel, a rank killed on one node, and a requeued job, each resumed from its run directory.

Every job is submitted from the checkout, as the README says, with its output file and run
directory in the test's own directory. One cluster serves every test of the file. Skipped, with
the reason, where the cluster cannot be made (not root, SLURM or munge not installed); under CI
as root that is a failure instead (helpers.skip_unless_optional).
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import (BIN, MULTIHOST_TRAIN_ARGS as TRAIN_ARGS, REPORT_HOST, TESTS,
                     assert_same_training, launcher_env)
from slurm_cluster import SlurmCluster

# A test here waits for up to three jobs of JOB_LIMIT_S each (below).
pytestmark = [pytest.mark.multirank, pytest.mark.alone, pytest.mark.timeout(900)]

ROOT = TESTS.parent
SCRIPT = "run_scripts/slurm.sbatch"
# test_multihost's job, longer (10 epochs of 30 steps), so that a cancel, a kill or a requeue
# lands mid-training. This job is chaotic (lr 0.15, batch 16): a rounding difference at epoch 4
# is a 25% different loss at epoch 8. So the all-reduce runs one tensor at a time (no fusion:
# which tensors share a buffer is a matter of timing, and it changes MPI's summation order) and
# every rank on one TensorFlow thread (a rank alone on its node would otherwise take both cores
# and split its sums differently from the one-host ranks).
EPOCHS = 10
ARGS = [*TRAIN_ARGS, "--epochs", str(EPOCHS), "--batch-size", "16",
        "--set", "horovod.fusion_threshold_mb=0",
        "--set", "run.intra_op_threads=1", "--set", "run.inter_op_threads=1"]
# 3 nodes x 1 task; SLURM's own time limit (minutes) backs up the test's on every job.
NODES = ["--nodes=3", "--ntasks-per-node=1", "--time=5"]
JOB_LIMIT_S = 240     # any job here: a hang fails the test (the job is cancelled) instead
GONE_WITHIN_S = 5     # "within seconds": every rank on every node ended after scancel or a kill


CLUSTER = SlurmCluster   # conftest's `cluster`
# conftest's `one_host`: the same job as 3 ranks under mpirun on this machine, what every SLURM
# run must equal.
ONE_HOST = ("mpi", 3, ARGS)


@dataclass
class Job:
    id: str
    run_dir: Path
    output_file: Path
    report: Path

    def output(self) -> str:
        return self.output_file.read_text() if self.output_file.exists() else ""

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def hosts(self) -> dict[int, tuple[str, str]]:
        """Where each rank ran, as it reported: rank -> (host name, address)."""
        return {int(f.stem.removeprefix("rank")): tuple(f.read_text().split())
                for f in self.report.glob("rank*.host")}

    def checkpointed(self) -> list[int]:
        """The epochs of the complete checkpoints (renamed from .epoch-NNNN.tmp-PID when done)."""
        return [int(d.name.removeprefix("epoch-"))
                for d in (self.run_dir / "checkpoints").glob("epoch-[0-9]*")]

    def epochs_logged(self) -> list[int]:
        log = self.run_dir / "metrics.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        return [json.loads(line)["epoch"] for line in lines if line.endswith("}")]


def submit(cluster: SlurmCluster, tmp_path: Path, *, sbatch: list[str] = (),
           script: list[str] | None = None, train: list[str] = ARGS, run_dir: str = "run",
           env: dict[str, str] | None = None) -> Job:
    """sbatch from the checkout (the README's way): the script with ``train`` and a run dir in
    ``tmp_path``, or ``script`` instead (an --wrap command). Every rank reports its host."""
    shim = tmp_path / "bin"   # `hvdtrain` here records the rank's host, then runs the real one
    shim.mkdir(exist_ok=True)
    (shim / "hvdtrain").write_text(
        f'#!/bin/sh\nexec {REPORT_HOST} {BIN / "hvdtrain"} "$@"\n')
    (shim / "hvdtrain").chmod(0o755)
    report = tmp_path / f"report-{run_dir}"
    report.mkdir(exist_ok=True)
    base = launcher_env()
    base.pop("HVDTRAIN_HOME", None)   # the script must find the checkout from SLURM_SUBMIT_DIR
    job_env = {**base, "PATH": f"{shim}:{base['PATH']}", "REPORT_DIR": str(report),
               "REPORT_IFACE": cluster.interface, **(env or {})}
    out = tmp_path / "job-%j.out"
    command = script or [SCRIPT, *train, "--run-dir", str(tmp_path / run_dir)]
    job_id = cluster.sbatch([f"--output={out}", *NODES, *sbatch, *command],
                            env=job_env, cwd=ROOT)
    return Job(job_id, tmp_path / run_dir, Path(str(out).replace("%j", job_id)), report)


def finish(cluster: SlurmCluster, job: Job) -> dict[str, str]:
    return cluster.wait(job.id, timeout=JOB_LIMIT_S)


def wait_for_checkpoint(cluster: SlurmCluster, job: Job, epoch: int) -> None:
    """Returns once a complete checkpoint of ``epoch`` or later exists (metrics.jsonl is
    written before it); fails if the job ends or hangs first."""
    deadline = time.monotonic() + JOB_LIMIT_S
    while max(job.checkpointed(), default=0) < epoch:
        state = cluster.job(job.id)["JobState"]
        assert state in {"PENDING", "RUNNING", "CONFIGURING"}, f"{state}:\n{job.output()}"
        if time.monotonic() > deadline:
            cluster.cancel(job.id)
            pytest.fail(f"job {job.id}: no checkpoint of epoch {epoch} or later in "
                        f"{JOB_LIMIT_S} s\n{job.output()}")
        time.sleep(0.1)


def ranks_alive(cluster: SlurmCluster) -> list[tuple[str, int]]:
    return cluster.processes("bin/hvdtrain train")


def seconds_until_no_rank(cluster: SlurmCluster, since: float, limit: float = 60) -> float:
    while ranks_alive(cluster) and time.monotonic() - since < limit:
        time.sleep(0.1)
    return time.monotonic() - since


def rank_pid(cluster: SlurmCluster, rank: int) -> tuple[str, int]:
    """(host, pid) of the hvdtrain task whose SLURM_PROCID is ``rank``."""
    for host, pid in ranks_alive(cluster):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"SLURM_PROCID={rank}".encode() in environ:
            return host, pid
    raise AssertionError(f"no hvdtrain task with SLURM_PROCID={rank}: {ranks_alive(cluster)}")


def assert_ran_on_three_nodes(cluster: SlurmCluster, job: Job) -> None:
    """Rank r ran on node r+1, at that namespace's address; Horovod saw all three; it learned."""
    assert job.hosts() == {r: (name, address) for r, (name, address)
                           in enumerate(zip(cluster.names, cluster.addresses))}, job.output()
    summary = job.summary()
    assert summary["world_size"] == 3 and summary["controller"] == "mpi"
    assert summary["final_eval_accuracy"] >= 0.85, summary


# ---------------------------------------------------------------------------------------------
# Launching: mpirun inside the allocation (srun, the script's default: the scancel test below).

def test_sbatch_mpirun_inside_the_allocation_equals_one_host(cluster, one_host, tmp_path):
    job = submit(cluster, tmp_path, env={"LAUNCHER": "mpirun"})
    state = finish(cluster, job)
    assert state["JobState"] == "COMPLETED", job.output()
    assert "3 tasks on 3 nodes (host[1-3]) via mpirun" in job.output()
    assert_ran_on_three_nodes(cluster, job)
    assert_same_training(job.summary(), one_host)


def test_pmix_is_the_one_pmi_that_slurm_and_open_mpi_share(cluster, tmp_path):
    """Why the script's default is --mpi=pmix: SLURM offers pmi2 and pmix, but Debian's Open
    MPI 4.1 has only a PMIx client (its ext3x component, on the same libpmix 4 that SLURM's
    pmix_v4 plugin loads) and no PMI-1/PMI-2 client (components s1, s2): with --mpi=pmi2 every
    task dies in MPI_Init. The job with pmix is the test above."""
    offered = cluster.run(["srun", "--mpi=list"], env=cluster.env(launcher_env())).stdout
    assert {"pmi2", "pmix", "pmix_v4"} <= set(re.findall(r"\w+", offered)), offered
    ompi = subprocess.run(["ompi_info", "--parsable"], capture_output=True, text=True, timeout=60)
    clients = set(re.findall(r"^mca:pmix:(\w+):", ompi.stdout, flags=re.M))
    assert "ext3x" in clients and not clients & {"s1", "s2"}, clients

    job = submit(cluster, tmp_path, env={"SRUN_MPI": "pmi2"})
    state = finish(cluster, job)
    assert state["JobState"] == "FAILED", job.output()
    assert "OMPI was not built with SLURM's PMI support" in job.output()
    assert not job.run_dir.exists()   # no rank got past hvd.init()


# ---------------------------------------------------------------------------------------------
# One GPU per task: SLURM's binding gives each task its own CUDA_VISIBLE_DEVICES.

# Two tasks on one node, each given one of its GPUs (the cluster's gres, slurm_cluster.py);
# tests/fake_gpus makes TensorFlow list the GPUs each task was given and records which it pins.
PER_TASK = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-task=1"]
FAKE_GPUS = {"PYTHONPATH": str(TESTS / "fake_gpus")}


def pinned(job: Job) -> dict[int, tuple[str, int]]:
    """Each rank's CUDA_VISIBLE_DEVICES and the index of the GPU it pinned among them."""
    found = {}
    for f in job.report.glob("gpu-rank*.json"):
        record = json.loads(f.read_text())
        found[int(f.stem.removeprefix("gpu-rank"))] = (record["CUDA_VISIBLE_DEVICES"],
                                                       record["pinned"])
    return found


def test_one_gpu_per_task_each_rank_pins_the_gpu_srun_gave_it(cluster, tmp_path):
    """The script's srun line with --gpus-per-task=1: two ranks on a node, each seeing one GPU
    (its own CUDA_VISIBLE_DEVICES), train with each pinning the one it was given."""
    job = submit(cluster, tmp_path, sbatch=PER_TASK, env=FAKE_GPUS,
                 train=[*TRAIN_ARGS, "--epochs", "1"])
    assert finish(cluster, job)["JobState"] == "COMPLETED", job.output()
    assert pinned(job) == {0: ("0", 0), 1: ("1", 0)}, job.output()
    summary = job.summary()
    assert summary["world_size"] == 2 and summary["device"] == "/GPU:0", summary


@pytest.mark.fault
def test_control_two_tasks_given_one_gpu_stop_naming_both(cluster, tmp_path):
    """The same job with both tasks bound to GPU 0 (--gpu-bind=map_gpu:0): every rank stops
    with one line naming both ranks and the GPU, before training."""
    job = submit(cluster, tmp_path, sbatch=[*PER_TASK, "--gpu-bind=map_gpu:0"], env=FAKE_GPUS,
                 train=[*TRAIN_ARGS, "--epochs", "1"])
    assert finish(cluster, job)["JobState"] == "FAILED", job.output()
    assert pinned(job) == {0: ("0", 0), 1: ("0", 0)}, job.output()
    errors = [line for line in job.output().splitlines() if "hvdtrain: error:" in line]
    assert len(errors) == 1, job.output()
    assert "ranks 0 and 1 on host host1 would share GPU 0" in errors[0], errors
    assert not (job.run_dir / "summary.json").exists()


# ---------------------------------------------------------------------------------------------
# Failures: scancel, a rank killed on one node, a requeued job.

@pytest.mark.fault
def test_scancel_ends_every_rank_and_the_same_command_resumes(cluster, one_host, tmp_path):
    # The pattern users should copy: a fixed --run-dir and --resume on every submission.
    first = submit(cluster, tmp_path, train=[*ARGS, "--resume"])
    wait_for_checkpoint(cluster, first, 2)
    assert len(ranks_alive(cluster)) == 3
    cancelled_at = time.monotonic()
    cluster.cancel(first.id)
    seconds = seconds_until_no_rank(cluster, cancelled_at)
    print(f"every rank gone {seconds:.1f} s after scancel")
    assert not ranks_alive(cluster) and seconds < GONE_WITHIN_S, (seconds, ranks_alive(cluster))
    assert finish(cluster, first)["JobState"] == "CANCELLED"
    logged = first.epochs_logged()
    assert 2 <= len(logged) < EPOCHS, logged   # it was cancelled mid-training
    assert not (first.run_dir / "summary.json").exists()

    # The script's default launch (srun, one task per node) equals one host: the resumed job
    # trains on three nodes to the end, as the uninterrupted one-host job does.
    again = submit(cluster, tmp_path, train=[*ARGS, "--resume"])
    assert again.id != first.id
    assert finish(cluster, again)["JobState"] == "COMPLETED", again.output()
    assert "3 tasks on 3 nodes (host[1-3]) via srun" in again.output()
    done = int(re.search(r"resuming \S+ after epoch (\d+)", again.output()).group(1))
    assert done >= 2 and again.summary()["resumed_from_epoch"] == done
    assert set(again.epochs_logged()) == set(range(1, EPOCHS + 1))
    assert_ran_on_three_nodes(cluster, again)
    assert_same_training(again.summary(), one_host)   # cancelled + resumed == straight


@pytest.mark.fault
def test_killed_rank_ends_the_step_within_seconds_naming_it(cluster, tmp_path):
    job = submit(cluster, tmp_path)
    wait_for_checkpoint(cluster, job, 1)
    host, pid = rank_pid(cluster, 1)
    assert host == cluster.names[1]
    killed_at = time.monotonic()
    cluster.kill(pid)
    seconds = seconds_until_no_rank(cluster, killed_at)
    print(f"every rank gone {seconds:.1f} s after the kill of rank 1")
    assert not ranks_alive(cluster) and seconds < GONE_WITHIN_S, (seconds, ranks_alive(cluster))
    assert finish(cluster, job)["JobState"] == "FAILED"
    assert "srun: error: host2: task 1: Killed" in job.output(), job.output()
    assert not (job.run_dir / "summary.json").exists()


def test_control_without_kill_on_bad_exit_the_other_ranks_hang(cluster, tmp_path):
    """The control for the test above: the script's srun line without --kill-on-bad-exit
    leaves the two other ranks waiting in an all-reduce after rank 1 is killed."""
    train = " ".join(["hvdtrain", "train", *ARGS, "--run-dir", str(tmp_path / "run")])
    job = submit(cluster, tmp_path, script=[f"--wrap=srun --mpi=pmix {train}"])
    try:
        wait_for_checkpoint(cluster, job, 1)
        cluster.kill(rank_pid(cluster, 1)[1])
        time.sleep(GONE_WITHIN_S)
        left = sorted(host for host, _ in ranks_alive(cluster))
        assert left == [cluster.names[0], cluster.names[2]], job.output()
    finally:
        cluster.cancel(job.id)
    assert finish(cluster, job)["JobState"] == "CANCELLED"


@pytest.mark.fault
def test_requeued_job_resumes_by_itself(cluster, one_host, tmp_path):
    job = submit(cluster, tmp_path, sbatch=["--requeue"], train=[*ARGS, "--resume"])
    wait_for_checkpoint(cluster, job, 2)
    requeued_at = time.monotonic()
    cluster.scontrol("requeue", job.id)
    pending = cluster.wait(job.id, timeout=60, states={"PENDING"})
    assert pending["Restarts"] == "1"
    # SLURM holds a requeued job back for about two minutes (Reason=BeginTime); a real cluster
    # waits, the test lets it start as soon as the nodes are done with its first run, and in a
    # later second than the requeue (slurmd refuses a launch credential made in the second its
    # job's previous credential was revoked: "Job credential revoked").
    cluster.wait_idle(timeout=60)
    time.sleep(max(0.0, requeued_at + 1.5 - time.monotonic()))
    cluster.scontrol("update", f"JobId={job.id}", "StartTime=now")
    state = finish(cluster, job)
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", job.output()
    done = int(re.search(r"resuming \S+ after epoch (\d+)", job.output()).group(1))
    assert done >= 2 and job.summary()["resumed_from_epoch"] == done
    assert_ran_on_three_nodes(cluster, job)
    assert_same_training(job.summary(), one_host)
