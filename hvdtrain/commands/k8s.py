"""``hvdtrain launch k8s``: a Kubeflow MPI Operator job (``MPIJob``, ``kubeflow.org/v2beta1``)
that runs hvdtrain's own hostfile launcher (run_scripts/mpirun_hostfile.sh) from the operator's
launcher pod, printed as YAML for ``kubectl apply -f -``.

    hvdtrain launch k8s --workers 2 --slots-per-worker 1 --image hvdtrain:latest -- --preset digits

The operator mounts its hostfile (``NAME-worker-I.NAME.NS.svc slots=K``) at /etc/mpi/hostfile,
makes the worker names resolvable through a headless service, and sets up SSH from the launcher
to the workers (its keys under ``sshAuthMountPath``). The run directory lives on a volume every
worker mounts, and the launcher line carries ``--resume``: a launcher restarted after a lost pod
continues from the last checkpoint. Nothing here imports TensorFlow or Horovod.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, Sequence

from hvdtrain.commands.parsing import Parser
from hvdtrain.errors import UserError

API_VERSION = "kubeflow.org/v2beta1"
# Where the operator mounts its hostfile in the launcher pod (mpi_job_controller.go:
# configMountPath + hostfileName).
OPERATOR_HOSTFILE = "/etc/mpi/hostfile"
# The image's non-root user (its uid, and the home where the operator mounts the SSH keys).
USER_ID = 1000
HOME = "/home/mpiuser"
# The worker's SSH server as the operator's own non-root example runs it (examples/v2beta1/pi).
WORKER_SSHD = ["/usr/sbin/sshd", "-De", "-f", f"{HOME}/.sshd_config"]
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# A Kubernetes resource quantity (the CRD's own pattern for resources).
_QUANTITY = re.compile(r"(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                       r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# The worker's sshd port (container/Containerfile: Port 2222), probed for readiness.
SSH_PORT = 2222


@dataclass(frozen=True)
class Job:
    """What the printed MPIJob runs, and where."""
    name: str
    workers: int
    slots: int
    image: str
    train_args: tuple[str, ...] = ()
    namespace: str = ""              # none: kubectl apply -n NS (or the context's) decides
    interface: str = "eth0"          # the pods' training network: MPI's traffic goes there only
    volume: str = ""                 # the PersistentVolumeClaim of the run directory
    mount: str = "/runs"             # where the workers mount it
    gpus: int = 0                    # per worker; one per slot
    gpu_image: bool = False          # the user says the image has GPUs (Containerfile.gpu)
    cpu: str = ""
    memory: str = ""
    backoff_limit: int = 3           # launcher restarts (each resumes) before the job fails
    ttl_seconds: int = 86400         # a finished job (and its pods) deleted after this
    launcher_cpu: str = "500m"       # the launcher pod runs mpirun alone
    launcher_memory: str = "512Mi"
    shm_size: str = "1Gi"            # /dev/shm, Open MPI's shared-memory transport
    labels: tuple[tuple[str, str], ...] = ()         # e.g. Kueue's queue-name
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()                # KEY[=VALUE]:EFFECT
    pull_secrets: tuple[str, ...] = ()
    service_account: str = ""
    priority_class: str = ""
    gang: bool = False               # schedulingPolicy: every pod at once, or none
    queue: str = ""                  # schedulingPolicy.queue
    runtime: str = "hvdtrain"        # --format trainjob: the ClusterTrainingRuntime's name

    @property
    def run_dir(self) -> str:
        return f"{self.mount.rstrip('/')}/{self.name}"


def check(job: Job) -> None:
    """UserError, in one line, for a job the operator would refuse or that cannot run."""
    last_pod = f"{job.name}-worker-{job.workers - 1}"
    if not DNS_LABEL.fullmatch(job.name) or len(last_pod) > 63:
        raise UserError(f"--name {job.name!r}: the pod name {last_pod!r} must be a DNS label "
                        f"(lower-case letters, digits and '-', at most 63 characters)")
    if job.workers < 1 or job.slots < 1:
        raise UserError("--workers and --slots-per-worker must be at least 1")
    if job.gpus and not job.gpu_image:
        raise UserError(f"--gpus-per-worker {job.gpus}: make image's hvdtrain:latest is CPU-only "
                        f"(tensorflow-cpu, Horovod without NCCL); build container/Containerfile"
                        f".gpu and add --gpu-image to say the image has GPUs")
    if job.gpus and job.gpus != job.slots:
        raise UserError(f"--gpus-per-worker {job.gpus} must equal --slots-per-worker "
                        f"{job.slots}: hvdtrain pins one GPU per rank")
    if any(arg == "--run-dir" or arg.startswith("--run-dir=") for arg in job.train_args):
        raise UserError(f"--run-dir is set by launch k8s ({job.run_dir}, on the volume, so that "
                        f"--resume finds it): choose --mount and --name instead")
    for flag, value in (("--cpu", job.cpu), ("--memory", job.memory),
                        ("--launcher-cpu", job.launcher_cpu),
                        ("--launcher-memory", job.launcher_memory), ("--shm-size", job.shm_size)):
        if value and not _QUANTITY.fullmatch(value):
            raise UserError(f"{flag} {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 8Gi)")
    for toleration in job.tolerations:
        _toleration(toleration)
    check_train_args(job.train_args)


def check_train_args(train_args: Sequence[str]) -> None:
    """The checks ``hvdtrain train`` makes of its arguments, here before printing (a typo would
    otherwise fail only in the pod). A --config file is the pod's, read there."""
    from hvdtrain.commands import train  # the train command's own flags and config
    parser = Parser(prog="hvdtrain train", add_help=False)
    train.add_arguments(parser)
    args = parser.parse_args(list(train_args))
    train.config_from_args(argparse.Namespace(**{**vars(args), "config": None}))


def launcher_command(job: Job) -> list[str]:
    """The launcher pod's command: hvdtrain's hostfile launcher on the operator's hostfile,
    MPI bound to the pods' interface, the run on the volume, resumed after a restart."""
    return ["hvdtrain", "launch", "hostfile", "-f", OPERATOR_HOSTFILE, "-i", job.interface,
            "--", *job.train_args, "--run-dir", job.run_dir, "--resume"]


def _resources(job: Job) -> dict[str, Any]:
    asked = {"cpu": job.cpu, "memory": job.memory}
    limits: dict[str, Any] = {key: value for key, value in asked.items() if value}
    if job.gpus:
        limits["nvidia.com/gpu"] = job.gpus
    return {"limits": limits, "requests": dict(limits)} if limits else {}


def _toleration(text: str) -> dict[str, str]:
    """``KEY[=VALUE]:EFFECT`` as a pod toleration."""
    pair, _, effect = text.rpartition(":")
    key, equal, value = pair.partition("=")
    if not key or effect not in _EFFECTS:
        raise UserError(f"--toleration {text!r}: write KEY[=VALUE]:EFFECT, EFFECT one of "
                        f"{', '.join(_EFFECTS)}")
    found = {"key": key, "operator": "Equal" if equal else "Exists", "effect": effect}
    return {**found, "value": value} if equal else found


def pod_template(job: Job, container: dict[str, Any], role: str) -> dict[str, Any]:
    """A pod template as the non-root user (fsGroup: the volume writable by it), with the
    placement the job asks for; a worker's also mounts the run volume and a memory /dev/shm."""
    spec: dict[str, Any] = {
        "securityContext": {"runAsUser": USER_ID, "runAsGroup": USER_ID, "fsGroup": USER_ID},
        "containers": [{"image": job.image, "imagePullPolicy": "IfNotPresent", **container}]}
    if role == "worker":
        spec["containers"][0]["volumeMounts"] = [{"name": "runs", "mountPath": job.mount},
                                                 {"name": "shm", "mountPath": "/dev/shm"}]
        spec["volumes"] = [
            {"name": "runs", "persistentVolumeClaim": {"claimName": job.volume or
                                                       f"{job.name}-runs"}},
            # A pod's own /dev/shm is 64 MB, too small for Open MPI's shared memory.
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": job.shm_size}}]
    placement = {
        "nodeSelector": dict(job.node_selector),
        "tolerations": [_toleration(t) for t in job.tolerations],
        "imagePullSecrets": [{"name": name} for name in job.pull_secrets],
        "serviceAccountName": job.service_account,
        "priorityClassName": job.priority_class}
    spec.update({key: value for key, value in placement.items() if value})
    template: dict[str, Any] = {"spec": spec}
    if job.labels:
        template["metadata"] = {"labels": dict(job.labels)}
    return template


def _run_policy(job: Job) -> dict[str, Any]:
    policy: dict[str, Any] = {"cleanPodPolicy": "Running", "backoffLimit": job.backoff_limit,
                              "ttlSecondsAfterFinished": job.ttl_seconds}
    scheduling = {"minAvailable": job.workers + 1 if job.gang else 0, "queue": job.queue,
                  "priorityClass": job.priority_class if job.gang or job.queue else ""}
    scheduling = {key: value for key, value in scheduling.items() if value}
    if scheduling:
        policy["schedulingPolicy"] = scheduling
    return policy


def worker_container(job: Job) -> dict[str, Any]:
    """A worker's container but its name: the SSH server, ready once it takes connections
    (the launcher starts when every worker is)."""
    worker: dict[str, Any] = {"command": WORKER_SSHD[:1], "args": WORKER_SSHD[1:],
                              "readinessProbe": {"tcpSocket": {"port": SSH_PORT},
                                                 "initialDelaySeconds": 2, "periodSeconds": 5}}
    if _resources(job):
        worker["resources"] = _resources(job)
    return worker


def launcher_container(job: Job) -> dict[str, Any]:
    """The launcher's container but its name: the launcher line, and mpirun's resources."""
    command = launcher_command(job)
    limits = {"cpu": job.launcher_cpu, "memory": job.launcher_memory}
    return {"command": command[:1], "args": command[1:],
            "resources": {"limits": limits, "requests": dict(limits)}}


def mpijob(job: Job) -> dict[str, Any]:
    """The MPIJob, as the dict ``kubectl`` would read from its YAML."""
    check(job)
    worker = {"name": "worker", **worker_container(job)}
    launcher = {"name": "launcher", **launcher_container(job)}
    metadata: dict[str, Any] = {"name": job.name}
    if job.namespace:
        metadata["namespace"] = job.namespace
    if job.labels:
        metadata["labels"] = dict(job.labels)
    return {
        "apiVersion": API_VERSION, "kind": "MPIJob", "metadata": metadata,
        "spec": {
            "slotsPerWorker": job.slots, "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": f"{HOME}/.ssh", "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": _run_policy(job),
            "mpiReplicaSpecs": {
                # OnFailure: the operator's validation takes Never or OnFailure only (not
                # ExitCode), so a user error (exit 2) is retried too, up to backoffLimit.
                "Launcher": {"replicas": 1, "restartPolicy": "OnFailure",
                             "template": pod_template(job, launcher, "launcher")},
                "Worker": {"replicas": job.workers,
                           "template": pod_template(job, worker, "worker")},
            }}}
