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
from hvdtrain.commands import k8s
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
         "--gpus-per-worker", "2", "--cpu", "4", "--memory", "8Gi",
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
    assert pod["containers"][0]["volumeMounts"] == [{"name": "runs", "mountPath": "/runs"}]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "digits-runs"}
    assert pod["securityContext"]["runAsUser"] == 1000


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


@pytest.mark.fault
@pytest.mark.parametrize("args, expected", [
    (["--name", "Digits"], "--name 'Digits': the pod name 'Digits-worker-1' must be a DNS label"),
    (["--gpus-per-worker", "1", "--slots-per-worker", "2"],
     "--gpus-per-worker 1 must equal --slots-per-worker 2"),
    (["--", "--run-dir", "runs/x"], "--run-dir is set by launch k8s (/runs/hvdtrain"),
    (["--workers", "0"], "--workers and --slots-per-worker must be at least 1"),
])
def test_bad_input_is_one_line(capsys, args, expected):
    assert cli.run(["launch", "k8s", "--image", "hvdtrain:latest", "--workers", "2", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("hvdtrain: error: ") and expected in line, line


def test_yaml_quotes_what_yaml_would_misread():
    lines = k8s.to_yaml({"a": ["-np", "true", "2", "", "x y", "eth0"], "b": {}, "c": 0})
    assert yaml.safe_load("\n".join(lines)) == {
        "a": ["-np", "true", "2", "", "x y", "eth0"], "b": {}, "c": 0}
