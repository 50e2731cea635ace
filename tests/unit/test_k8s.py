"""``hvdtrain launch k8s`` prints an MPIJob that the Kubeflow MPI Operator accepts: its YAML, read
by a YAML parser, checked against the MPIJob CRD's openAPIV3Schema from the operator's repository
(tests/data/mpijob-v2beta1-schema.json, its source inside) and against the operator's own
validation of what the CRD leaves open (pkg/apis/kubeflow/validation/validation.go). Controls: a
misspelt field, a missing required one, a wrong type and a value outside an enum each fail it.
Its launcher line trains for real in tests/cluster/test_multihost.py.
"""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from hvdtrain import cli
from hvdtrain.commands.yaml_lines import to_yaml
from helpers import TESTS
from openapi_schema import problems

pytestmark = pytest.mark.one_stack   # no TensorFlow, no launcher: the same on both stacks

SOURCE = json.loads((TESTS / "data" / "mpijob-v2beta1-schema.json").read_text())
SCHEMA = SOURCE["openAPIV3Schema"]
# validation.go's sets; restartPolicy empty is defaulted first (v2beta1/default.go).
OPERATOR_VALUES = {"cleanPodPolicy": {"None", "Running", "All"},
                   "launcherCreationPolicy": {"AtStartup", "WaitForWorkersReady"},
                   "restartPolicy": {"Never", "OnFailure"}}


def operator_problems(job: dict) -> list[str]:
    """What the operator's validation.go refuses that the CRD's schema lets through."""
    spec, found = job["spec"], []
    replicas = spec.get("mpiReplicaSpecs", {})
    if replicas.get("Launcher", {}).get("replicas") != 1:
        found.append("Launcher replicas must be 1")
    if replicas.get("Worker", {}).get("replicas", 1) < 1:
        found.append("Worker replicas must be >= 1")
    checked = [("cleanPodPolicy", spec.get("runPolicy", {}).get("cleanPodPolicy")),
               ("launcherCreationPolicy", spec.get("launcherCreationPolicy"))]
    checked += [("restartPolicy", r.get("restartPolicy")) for r in replicas.values()]
    found += [f"{name} {value!r}" for name, value in checked
              if value is not None and value not in OPERATOR_VALUES[name]]
    found += [f"{role} has no container" for role, r in replicas.items()
              if not r.get("template", {}).get("spec", {}).get("containers")]
    return found


def printed(capsys, *args: str) -> dict:
    """The MPIJob ``hvdtrain launch k8s ARGS`` prints, read back by PyYAML."""
    assert cli.run(["launch", "k8s", *args]) == 0
    return yaml.safe_load(capsys.readouterr().out)


ASKED = ["--workers", "3", "--slots-per-worker", "2", "--image", "hvdtrain:latest",
         "--name", "digits", "--namespace", "ml", "--interface", "net1",
         "--gpus-per-worker", "2", "--gpu-image", "--cpu", "4", "--memory", "8Gi",
         "--", "--preset", "digits", "--set", "train.epochs=3"]


def test_printed_mpijob_fits_the_operators_crd_schema_and_validation(capsys):
    assert SOURCE["version"] == "v2beta1" and SOURCE["kind"] == "MPIJob"
    job = printed(capsys, *ASKED)
    assert problems(job, SCHEMA) == []
    assert operator_problems(job) == []
    spec = job["spec"]
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["metadata"]["name"] == "digits"
    assert (spec["slotsPerWorker"], spec["mpiImplementation"], spec["sshAuthMountPath"],
            spec["launcherCreationPolicy"], spec["runPolicy"]["cleanPodPolicy"]) == (
        2, "OpenMPI", "/home/mpiuser/.ssh", "WaitForWorkersReady", "Running")
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] + launcher["args"] == [
        "hvdtrain", "launch", "hostfile", "-f", "/etc/mpi/hostfile", "-i", "net1", "--",
        "--preset", "digits", "--set", "train.epochs=3", "--run-dir", "/runs/digits", "--resume"]
    worker = spec["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    pod = worker["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {
        "cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 2}
    assert pod["containers"][0]["volumeMounts"] == [{"name": "runs", "mountPath": "/runs"},
                                                    {"name": "shm", "mountPath": "/dev/shm"}]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "digits-runs"}
    # Open MPI's shared memory in a memory-backed /dev/shm (a pod's own is 64 MB).
    assert pod["volumes"][1] == {"name": "shm", "emptyDir": {"medium": "Memory",
                                                             "sizeLimit": "1Gi"}}
    assert pod["securityContext"]["runAsUser"] == 1000
    # Ready when sshd takes connections (the image's port), so WaitForWorkersReady means it.
    assert pod["containers"][0]["readinessProbe"]["tcpSocket"] == {"port": 2222}
    assert job["metadata"]["namespace"] == "ml"
    # A finished job goes after a day; the launcher has requests and limits (quotas ask).
    assert spec["runPolicy"]["ttlSecondsAfterFinished"] == 86400
    assert launcher["resources"] == {"limits": {"cpu": "500m", "memory": "512Mi"},
                                     "requests": {"cpu": "500m", "memory": "512Mi"}}


PLACED = ["--workers", "2", "--image", "registry.example/hvdtrain:1", "--name", "placed",
          "--label", "kueue.x-k8s.io/queue-name=team-a", "--node-selector", "pool=cpu",
          "--toleration", "dedicated=ml:NoSchedule", "--toleration", "spot:NoExecute",
          "--image-pull-secret", "regcred", "--service-account", "trainer",
          "--priority-class", "high", "--gang", "--queue", "q1", "--ttl", "600",
          "--backoff-limit", "1", "--launcher-cpu", "1", "--launcher-memory", "1Gi",
          "--shm-size", "4Gi"]


def test_placement_scheduling_and_lifetime_flags_fit_the_schema(capsys):
    job = printed(capsys, *PLACED)
    assert problems(job, SCHEMA) == [] and operator_problems(job) == []
    assert "namespace" not in job["metadata"]   # kubectl apply -n NS decides
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    policy = job["spec"]["runPolicy"]
    assert (policy["ttlSecondsAfterFinished"], policy["backoffLimit"]) == (600, 1)
    assert policy["schedulingPolicy"] == {"minAvailable": 3, "queue": "q1",
                                          "priorityClass": "high"}
    for role in ("Launcher", "Worker"):
        template = job["spec"]["mpiReplicaSpecs"][role]["template"]
        assert template["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
        pod = template["spec"]
        assert pod["nodeSelector"] == {"pool": "cpu"}
        assert pod["tolerations"] == [
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Exists", "effect": "NoExecute"}]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert (pod["serviceAccountName"], pod["priorityClassName"]) == ("trainer", "high")
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["volumes"][1]["emptyDir"]["sizeLimit"] == "4Gi"
    # Control: the schema catches a toleration misspelt as the flags never write it.
    misspelt = broken(job, lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
                      ["tolerations"][0].update(effects="NoSchedule"))
    assert len(problems(misspelt, SCHEMA)) == 1


def broken(job: dict, change) -> dict:
    job = copy.deepcopy(job)
    change(job)
    return job


def test_control_a_broken_mpijob_fails_the_check(capsys):
    job = printed(capsys, *ASKED)
    spec = lambda j: j["spec"]  # noqa: E731
    worker = lambda j: spec(j)["mpiReplicaSpecs"]["Worker"]["template"]["spec"]  # noqa: E731
    misspelt = broken(job, lambda j: spec(j).update(slotPerWorker=spec(j).pop("slotsPerWorker")))
    assert problems(misspelt, SCHEMA) == ["spec.slotPerWorker: unknown field"]
    unnamed = broken(job, lambda j: worker(j)["containers"][0].pop("name"))
    assert problems(unnamed, SCHEMA) == [
        "spec.mpiReplicaSpecs.Worker.template.spec.containers[0]: required field 'name' missing"]
    no_replicas = broken(job, lambda j: spec(j).pop("mpiReplicaSpecs"))
    assert problems(no_replicas, SCHEMA) == ["spec: required field 'mpiReplicaSpecs' missing"]
    as_text = broken(job, lambda j: spec(j).update(slotsPerWorker="2"))
    assert problems(as_text, SCHEMA) == ["spec.slotsPerWorker: '2' is not of type integer"]
    intel_typo = broken(job, lambda j: spec(j).update(mpiImplementation="OpenMP"))
    assert len(problems(intel_typo, SCHEMA)) == 1
    bad_memory = broken(job, lambda j: worker(j)["containers"][0]["resources"]["limits"]
                        .update(memory="8 GB"))
    assert len(problems(bad_memory, SCHEMA)) == 1
    policy = broken(job, lambda j: spec(j)["runPolicy"].update(cleanPodPolicy="Sometimes"))
    assert problems(policy, SCHEMA) == [] and operator_problems(policy) == [
        "cleanPodPolicy 'Sometimes'"]
    two_launchers = broken(job, lambda j: spec(j)["mpiReplicaSpecs"]["Launcher"]
                           .update(replicas=2))
    assert operator_problems(two_launchers) == ["Launcher replicas must be 1"]


def test_defaults_without_resources_fit_too(capsys):
    job = printed(capsys, "--workers", "2", "--image", "hvdtrain:latest")
    assert problems(job, SCHEMA) == [] and operator_problems(job) == []
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert "resources" not in worker and job["spec"]["slotsPerWorker"] == 1
    assert "namespace" not in job["metadata"] and "schedulingPolicy" not in job["spec"][
        "runPolicy"]


@pytest.mark.fault
@pytest.mark.parametrize("args, expected", [
    (["--name", "Digits"], "--name 'Digits': the pod name 'Digits-worker-1' must be a DNS label"),
    (["--gpus-per-worker", "1", "--slots-per-worker", "2", "--gpu-image"],
     "--gpus-per-worker 1 must equal --slots-per-worker 2"),
    # GPUs asked of the CPU-only image (make image's): the pods would hold GPUs they cannot use.
    (["--gpus-per-worker", "1"], "--gpus-per-worker 1: make image's hvdtrain:latest is CPU-only"),
    (["--", "--run-dir", "runs/x"], "--run-dir is set by launch k8s (/runs/hvdtrain"),
    (["--workers", "0"], "--workers and --slots-per-worker must be at least 1"),
    # Printed as given before, they failed only on the cluster.
    (["--cpu", "four"], "--cpu 'four' is not a Kubernetes quantity"),
    (["--shm-size", "1 GB"], "--shm-size '1 GB' is not a Kubernetes quantity"),
    (["--toleration", "gpu:Sometimes"], "--toleration 'gpu:Sometimes': write KEY[=VALUE]:EFFECT"),
    (["--label", "team"], "--label 'team': write KEY=VALUE"),
    # The training arguments, checked as hvdtrain train checks them.
    (["--", "--preset", "nosuch"], "unknown preset 'nosuch'"),
    (["--", "--set", "optim.lr=abc"], "optim.lr='abc': expected a number"),
    (["--", "--epochs", "x"], "argument --epochs: invalid int value: 'x'"),
])
def test_bad_input_is_one_line(capsys, args, expected):
    assert cli.run(["launch", "k8s", "--image", "hvdtrain:latest", "--workers", "2", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("hvdtrain: error: ") and expected in line, line


def test_yaml_quotes_what_yaml_would_misread():
    lines = to_yaml({"a": ["-np", "true", "2", "", "x y", "eth0"], "b": {}, "c": 0})
    assert yaml.safe_load("\n".join(lines)) == {
        "a": ["-np", "true", "2", "", "x y", "eth0"], "b": {}, "c": 0}
