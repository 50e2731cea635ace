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
import json
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
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./=-]*")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


@dataclass(frozen=True)
class Job:
    """What the printed MPIJob runs, and where."""
    name: str
    workers: int
    slots: int
    image: str
    train_args: tuple[str, ...] = ()
    namespace: str = "default"
    interface: str = "eth0"          # the pods' training network: MPI's traffic goes there only
    volume: str = ""                 # the PersistentVolumeClaim of the run directory
    mount: str = "/runs"             # where the workers mount it
    gpus: int = 0                    # per worker; one per slot
    cpu: str = ""
    memory: str = ""
    backoff_limit: int = 3           # launcher restarts (each resumes) before the job fails

    @property
    def run_dir(self) -> str:
        return f"{self.mount.rstrip('/')}/{self.name}"


def check(job: Job) -> None:
    """UserError, in one line, for a job the operator would refuse or that cannot run."""
    last_pod = f"{job.name}-worker-{job.workers - 1}"
    if not _DNS_LABEL.fullmatch(job.name) or len(last_pod) > 63:
        raise UserError(f"--name {job.name!r}: the pod name {last_pod!r} must be a DNS label "
                        f"(lower-case letters, digits and '-', at most 63 characters)")
    if job.workers < 1 or job.slots < 1:
        raise UserError("--workers and --slots-per-worker must be at least 1")
    if job.gpus and job.gpus != job.slots:
        raise UserError(f"--gpus-per-worker {job.gpus} must equal --slots-per-worker "
                        f"{job.slots}: hvdtrain pins one GPU per rank")
    if any(arg == "--run-dir" or arg.startswith("--run-dir=") for arg in job.train_args):
        raise UserError(f"--run-dir is set by launch k8s ({job.run_dir}, on the volume, so that "
                        f"--resume finds it): choose --mount and --name instead")


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


def _pod(job: Job, container: dict[str, Any], volumes: bool) -> dict[str, Any]:
    """A pod template as the non-root user (fsGroup: the volume writable by it)."""
    spec: dict[str, Any] = {
        "securityContext": {"runAsUser": USER_ID, "runAsGroup": USER_ID, "fsGroup": USER_ID},
        "containers": [{"image": job.image, "imagePullPolicy": "IfNotPresent", **container}]}
    if volumes:
        spec["containers"][0]["volumeMounts"] = [{"name": "runs", "mountPath": job.mount}]
        spec["volumes"] = [{"name": "runs", "persistentVolumeClaim": {
            "claimName": job.volume or f"{job.name}-runs"}}]
    return {"spec": spec}


def mpijob(job: Job) -> dict[str, Any]:
    """The MPIJob, as the dict ``kubectl`` would read from its YAML."""
    check(job)
    command = launcher_command(job)
    worker: dict[str, Any] = {"name": "worker", "command": WORKER_SSHD[:1],
                              "args": WORKER_SSHD[1:]}
    if _resources(job):
        worker["resources"] = _resources(job)
    return {
        "apiVersion": API_VERSION, "kind": "MPIJob",
        "metadata": {"name": job.name, "namespace": job.namespace},
        "spec": {
            "slotsPerWorker": job.slots, "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": f"{HOME}/.ssh", "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": job.backoff_limit},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": _pod(
                    job, {"name": "launcher", "command": command[:1], "args": command[1:]},
                    volumes=False)},
                "Worker": {"replicas": job.workers, "template": _pod(job, worker, volumes=True)},
            }}}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    plain = _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS
    return text if plain else json.dumps(text)  # a JSON string is a YAML double-quoted one


def to_yaml(value: Any, indent: int = 0) -> list[str]:
    """``value`` (dicts, lists, strings, numbers, booleans) as block-style YAML lines."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines += [f"{pad}{key}:", *to_yaml(item, indent + 2)]
            elif isinstance(item, (dict, list)):
                lines.append(f"{pad}{key}: {'{}' if isinstance(item, dict) else '[]'}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return lines
    lines = []
    for item in value:
        if isinstance(item, dict) and item:
            nested = to_yaml(item, indent + 2)
            lines += [f"{pad}- {nested[0].lstrip()}", *nested[1:]]
        else:
            lines.append(f"{pad}- {_scalar(item)}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--workers", type=int, required=True, help="worker pods (one SSH server each)")
    add("--slots-per-worker", type=int, default=1, help="ranks per worker (default 1)")
    add("--image", required=True, help="an image with hvdtrain, Horovod, Open MPI and sshd, "
                                       "e.g. hvdtrain:latest (make image)")
    add("--name", default="hvdtrain", help="the MPIJob's name (default hvdtrain)")
    add("--namespace", default="default")
    add("--interface", default="eth0", help="the pods' network interface MPI uses (eth0)")
    add("--volume", default="", help="PersistentVolumeClaim for the run directory "
                                     "(default NAME-runs; ReadWriteMany across nodes)")
    add("--mount", default="/runs", help="where workers mount it; the run is MOUNT/NAME")
    add("--gpus-per-worker", type=int, default=0, help="nvidia.com/gpu per worker (= slots)")
    add("--cpu", default="", help="CPU per worker, e.g. 4")
    add("--memory", default="", help="memory per worker, e.g. 8Gi")
    add("train_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
        help="hvdtrain train's arguments")


def main(argv: Sequence[str], prog: str = "hvdtrain launch k8s") -> int:
    """Parses ``argv`` and prints the MPIJob's YAML."""
    parser = Parser(prog=prog, description="Prints a Kubeflow MPIJob (kubeflow.org/v2beta1) "
                    "that trains with hvdtrain: kubectl apply -f the output.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    job = Job(name=args.name, workers=args.workers, slots=args.slots_per_worker,
              image=args.image, train_args=tuple(train_args), namespace=args.namespace,
              interface=args.interface, volume=args.volume, mount=args.mount,
              gpus=args.gpus_per_worker, cpu=args.cpu, memory=args.memory)
    print("\n".join(to_yaml(mpijob(job))), flush=True)
    return 0
