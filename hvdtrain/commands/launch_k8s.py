"""``hvdtrain launch k8s``'s flags, and the job it prints: the MPI Operator's MPIJob
(commands/k8s.py) or Kubeflow Trainer's TrainJob and runtime (commands/trainjob.py), from the
same flags. Nothing here imports TensorFlow or Horovod."""
from __future__ import annotations

import argparse
from typing import Sequence

from hvdtrain.commands import k8s, trainjob
from hvdtrain.commands.parsing import Parser
from hvdtrain.commands.yaml_lines import to_yaml
from hvdtrain.errors import UserError

FORMATS = ("mpijob", "trainjob")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--workers", type=int, required=True, help="worker pods (one SSH server each)")
    add("--slots-per-worker", type=int, default=1, help="ranks per worker (default 1)")
    add("--image", required=True, help="an image with hvdtrain, Horovod, Open MPI and sshd, "
                                       "e.g. hvdtrain:latest (make image)")
    add("--format", choices=FORMATS, default="mpijob",
        help="mpijob: the MPI Operator's MPIJob (default); trainjob: Kubeflow Trainer v2's "
             "TrainJob and the ClusterTrainingRuntime it names")
    add("--name", default="hvdtrain", help="the job's name (default hvdtrain)")
    add("--namespace", default="", help="the job's namespace (default: none written, so "
                                         "kubectl apply -n NS or the context decides)")
    add("--runtime", default="hvdtrain",
        help="--format trainjob: the ClusterTrainingRuntime's name (default hvdtrain)")
    add("--interface", default="eth0", help="the pods' network interface MPI uses (eth0)")
    add("--volume", default="", help="PersistentVolumeClaim for the run directory "
                                     "(default NAME-runs; ReadWriteMany across nodes)")
    add("--mount", default="/runs", help="where workers mount it; the run is MOUNT/NAME")
    add("--gpus-per-worker", type=int, default=0,
        help="nvidia.com/gpu per worker (= slots); needs --gpu-image")
    add("--gpu-image", action="store_true",
        help="the image has CUDA and Horovod with NCCL (container/Containerfile.gpu), not make "
             "image's CPU-only one")
    add("--cpu", default="", help="CPU per worker, e.g. 4")
    add("--memory", default="", help="memory per worker, e.g. 8Gi")
    add("--launcher-cpu", default="500m", help="the launcher pod's CPU (default 500m)")
    add("--launcher-memory", default="512Mi", help="the launcher pod's memory (default 512Mi)")
    add("--shm-size", default="1Gi", help="each worker's /dev/shm, in memory (default 1Gi)")
    add("--ttl", type=int, default=86400, metavar="SECONDS",
        help="delete the finished job after this (default 86400, a day)")
    add("--backoff-limit", type=int, default=3,
        help="launcher restarts, each resuming, before the job fails (default 3)")
    add("--label", action="append", default=[], metavar="KEY=VALUE",
        help="a label on the job and its pods, e.g. kueue.x-k8s.io/queue-name=team (repeatable)")
    add("--node-selector", action="append", default=[], metavar="KEY=VALUE",
        help="schedule pods on nodes with this label (repeatable)")
    add("--toleration", action="append", default=[], metavar="KEY[=VALUE]:EFFECT",
        help="tolerate a node taint (repeatable)")
    add("--image-pull-secret", action="append", default=[], metavar="NAME", help="(repeatable)")
    add("--service-account", default="", help="the pods' service account")
    add("--priority-class", default="", help="the pods' priority class")
    add("--gang", action="store_true",
        help="gang scheduling: every pod at once or none (the MPIJob's schedulingPolicy, the "
             "runtime's podGroupPolicy; needs Volcano or the scheduler-plugins' coscheduling)")
    add("--queue", default="", help="schedulingPolicy.queue (Volcano; MPIJob only)")
    add("train_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
        help="hvdtrain train's arguments")


def _pairs(flag: str, items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (key, equal, _) in zip(items, pairs) if not key or not equal]
    if bad:
        raise UserError(f"{flag} {bad[0]!r}: write KEY=VALUE")
    return tuple((key, value) for key, _, value in pairs)


def main(argv: Sequence[str], prog: str = "hvdtrain launch k8s") -> int:
    """Parses ``argv`` and prints the job's YAML: one document, or the runtime and the
    TrainJob."""
    parser = Parser(prog=prog, description="Prints a Kubeflow MPIJob (kubeflow.org/v2beta1), "
                    "or with --format trainjob a Kubeflow Trainer TrainJob and its runtime, "
                    "that trains with hvdtrain: kubectl apply -f the output.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    job = k8s.Job(name=args.name, workers=args.workers, slots=args.slots_per_worker,
                  image=args.image, train_args=tuple(train_args), namespace=args.namespace,
                  interface=args.interface, volume=args.volume, mount=args.mount,
                  gpus=args.gpus_per_worker, gpu_image=args.gpu_image, cpu=args.cpu,
                  memory=args.memory,
                  backoff_limit=args.backoff_limit, ttl_seconds=args.ttl,
                  launcher_cpu=args.launcher_cpu, launcher_memory=args.launcher_memory,
                  shm_size=args.shm_size, labels=_pairs("--label", args.label),
                  node_selector=_pairs("--node-selector", args.node_selector),
                  tolerations=tuple(args.toleration), pull_secrets=tuple(args.image_pull_secret),
                  service_account=args.service_account, priority_class=args.priority_class,
                  gang=args.gang, queue=args.queue, runtime=args.runtime)
    documents = [k8s.mpijob(job)] if args.format == "mpijob" else trainjob.documents(job)
    print("\n---\n".join("\n".join(to_yaml(doc)) for doc in documents), flush=True)
    return 0
