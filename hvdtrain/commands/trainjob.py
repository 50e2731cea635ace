"""``hvdtrain launch k8s --format trainjob``: the job of ``hvdtrain launch k8s`` for Kubeflow
Trainer v2 (``trainer.kubeflow.org/v1alpha1``), which new Kubeflow installs use in place of the
MPI Operator: a ClusterTrainingRuntime for hvdtrain (Trainer ships none for TensorFlow) and the
TrainJob that runs it, printed as two YAML documents for ``kubectl apply -f -``.

What Trainer (v2.3.0, pkg/runtime/framework/plugins/mpi/mpi.go and plugins/jobset) does with
them: it makes a JobSet of the runtime's replicated jobs, ``node`` (the workers' SSH servers,
``numNodes`` pods) and ``launcher`` (one pod, started once every node is ready); it writes the
hostfile ``TRAINJOB-node-0-I.TRAINJOB slots=K`` into /etc/mpi/hostfile of the launcher, sets
Open MPI's ``OMPI_MCA_*`` variables there, and mounts the SSH keys at ``sshAuthMountPath`` into
every container named ``node``. The TrainJob's trainer image and command reach the launcher
(the job labelled as the trainer step) only, so the workers' image, resources and volumes are
the runtime's. The launcher line is the MPIJob's: the same hostfile path, the same resume.
"""
from __future__ import annotations

from typing import Any

from hvdtrain.commands import k8s
from hvdtrain.errors import UserError

API_VERSION = "trainer.kubeflow.org/v1alpha1"
# Trainer mounts its SSH keys and hostfile into containers of this name only.
CONTAINER = "node"
# The label that makes a replicated job the trainer step: the TrainJob's image and command
# go to its container.
TRAINER_STEP = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
# hvdtrain's exit status for a user error: the launcher's Job fails at once, not retried.
USER_ERROR_EXIT = 2


def hostfile(name: str, workers: int, slots: int) -> list[str]:
    """The hostfile Trainer writes for Open MPI: one line per node pod, named by JobSet
    (``TRAINJOB-node-0-I``) under the TrainJob's subdomain."""
    return [f"{name}-node-0-{i}.{name} slots={slots}" for i in range(workers)]


def launcher_env(hostfile_path: str, slots: int) -> dict[str, str]:
    """The environment Trainer gives the launcher's container for Open MPI."""
    return {"OMPI_MCA_orte_default_hostfile": hostfile_path,
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_set_default_slots": str(slots),
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10"}


def _check(job: k8s.Job) -> None:
    k8s.check(job)
    if job.queue:
        raise UserError("--queue is the MPI Operator's (Volcano); with --format trainjob pass "
                        "Kueue's label instead: --label kueue.x-k8s.io/queue-name=QUEUE")
    if not k8s.DNS_LABEL.fullmatch(job.runtime):
        raise UserError(f"--runtime {job.runtime!r} must be a DNS label (lower-case letters, "
                        f"digits and '-')")


def runtime(job: k8s.Job) -> dict[str, Any]:
    """The ClusterTrainingRuntime: the workers' pods, the launcher's, and the MPI policy."""
    worker = {"name": CONTAINER, **k8s.worker_container(job)}
    launcher = {"name": CONTAINER, **k8s.launcher_container(job)}
    node_pod = k8s.pod_template(job, worker, "worker")
    node_pod["spec"]["restartPolicy"] = "OnFailure"
    launcher_pod = k8s.pod_template(job, launcher, "launcher")
    # Never: the Job, not the kubelet, restarts a failed launcher, so that its failure
    # policy sees the exit status.
    launcher_pod["spec"]["restartPolicy"] = "Never"
    spec: dict[str, Any] = {
        "mlPolicy": {"numNodes": job.workers,
                     "mpi": {"numProcPerNode": job.slots, "mpiImplementation": "OpenMPI",
                             "sshAuthMountPath": f"{k8s.HOME}/.ssh",
                             "runLauncherAsNode": False}},
        "template": {"spec": {
            "ttlSecondsAfterFinished": job.ttl_seconds,
            # The hostfile's names resolve before the workers are ready.
            "network": {"publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
            "replicatedJobs": [
                {"name": "node", "template": {"spec": {"template": node_pod}}},
                {"name": "launcher", "dependsOn": [{"name": "node", "status": "Ready"}],
                 "template": {"metadata": {"labels": dict(TRAINER_STEP)}, "spec": {
                     # Each retry resumes from the last checkpoint; a user error is final.
                     "backoffLimit": job.backoff_limit,
                     "podFailurePolicy": {"rules": [{
                         "action": "FailJob",
                         "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                         "values": [USER_ERROR_EXIT]}}]},
                     "template": launcher_pod}}}]}}}
    if job.gang:  # the scheduler-plugins' coscheduling: every pod at once or none
        spec["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 60}}
    return {"apiVersion": API_VERSION, "kind": "ClusterTrainingRuntime",
            "metadata": {"name": job.runtime,
                         "labels": {"trainer.kubeflow.org/framework": "hvdtrain"}},
            "spec": spec}


def trainjob(job: k8s.Job) -> dict[str, Any]:
    """The TrainJob: how many workers and ranks, and the launcher's image and line."""
    command = k8s.launcher_command(job)
    metadata: dict[str, Any] = {"name": job.name}
    if job.namespace:
        metadata["namespace"] = job.namespace
    if job.labels:
        metadata["labels"] = dict(job.labels)
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata,
            "spec": {"runtimeRef": {"name": job.runtime, "kind": "ClusterTrainingRuntime",
                                    "apiGroup": "trainer.kubeflow.org"},
                     "trainer": {"numNodes": job.workers, "numProcPerNode": job.slots,
                                 "image": job.image, "command": command[:1],
                                 "args": command[1:]}}}


def documents(job: k8s.Job) -> list[dict[str, Any]]:
    """The runtime, then the TrainJob (kubectl applies them in that order)."""
    _check(job)
    return [runtime(job), trainjob(job)]
