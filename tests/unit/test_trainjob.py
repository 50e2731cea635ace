"""``hvdtrain launch k8s --format trainjob`` prints a ClusterTrainingRuntime and a TrainJob that
Kubeflow Trainer v2 accepts and runs as hvdtrain needs: each document checked against its CRD's
openAPIV3Schema from Trainer's repository at tag v2.3.0 (tests/data/*-v1alpha1-schema.json, the
source inside each) and against what Trainer's MPI plugin and Kubernetes' Job validation ask
beyond the schema. Controls: a misspelt field, a wrong type, and each of the plugin's needs
broken in turn fail the check. Its launcher line trains for real, with Trainer's hostfile and
environment, in tests/cluster/test_multihost.py.
"""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from hvdtrain import cli
from hvdtrain.commands import trainjob
from helpers import TESTS
from openapi_schema import problems

pytestmark = pytest.mark.one_stack   # no TensorFlow, no launcher: the same on both stacks

SCHEMAS = {kind: json.loads((TESTS / "data" / f"{kind.lower()}-v1alpha1-schema.json")
                            .read_text())
           for kind in ("TrainJob", "ClusterTrainingRuntime")}
# Names Trainer's MPI plugin reserves in the TrainJob's trainer.env (constants.MPIReservedEnvNames).
RESERVED_ENV = {"OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args",
                "OMPI_MCA_orte_keep_fqdn_hostnames", "OMPI_MCA_orte_set_default_slots"}


def trainer_problems(runtime: dict, job: dict) -> list[str]:
    """What Trainer's MPI plugin needs of the pair, and Kubernetes' Job validation refuses,
    that the CRDs' schemas let through."""
    found = []
    jobs = {r["name"]: r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    if set(jobs) != {"node", "launcher"}:
        found.append(f"replicated jobs {sorted(jobs)}: the MPI plugin needs node and launcher")
    for name, replicated in jobs.items():
        pod = replicated["template"]["spec"]["template"]["spec"]
        if [c["name"] for c in pod["containers"]][:1] != [trainjob.CONTAINER]:
            found.append(f"{name}: the SSH keys and hostfile go to containers named node only")
        spec = replicated["template"]["spec"]
        if "podFailurePolicy" in spec and pod.get("restartPolicy") != "Never":
            found.append(f"{name}: a podFailurePolicy needs restartPolicy Never")
        if pod.get("restartPolicy") not in ("Never", "OnFailure"):
            found.append(f"{name}: a Job's pods restart Never or OnFailure")
    launcher = jobs.get("launcher", {}).get("template", {})
    if launcher.get("metadata", {}).get("labels") != trainjob.TRAINER_STEP:
        found.append("launcher: not the trainer step, so the TrainJob's command misses it")
    if runtime["metadata"]["name"] != job["spec"]["runtimeRef"]["name"]:
        found.append("the TrainJob names another runtime")
    found += [f"reserved env {e['name']}" for e in job["spec"]["trainer"].get("env", [])
              if e["name"] in RESERVED_ENV]
    return found


def printed(capsys, *args: str) -> tuple[dict, dict]:
    """The runtime and the TrainJob ``hvdtrain launch k8s --format trainjob ARGS`` prints."""
    assert cli.run(["launch", "k8s", "--format", "trainjob", *args]) == 0
    runtime, job = yaml.safe_load_all(capsys.readouterr().out)
    return runtime, job


def all_problems(runtime: dict, job: dict) -> list[str]:
    return (problems(runtime, SCHEMAS["ClusterTrainingRuntime"]["openAPIV3Schema"])
            + problems(job, SCHEMAS["TrainJob"]["openAPIV3Schema"])
            + trainer_problems(runtime, job))


ASKED = ["--workers", "3", "--slots-per-worker", "2", "--image", "hvdtrain:latest",
         "--name", "digits", "--namespace", "ml", "--interface", "net1", "--cpu", "4",
         "--memory", "8Gi", "--label", "kueue.x-k8s.io/queue-name=team-a",
         "--toleration", "spot:NoExecute", "--gang", "--runtime", "hvdtrain-cpu",
         "--", "--preset", "digits", "--set", "train.epochs=3"]


def test_printed_trainjob_and_runtime_fit_trainers_crds_and_plugin(capsys):
    assert {s["source"]["tag"] for s in SCHEMAS.values()} == {"v2.3.0"}
    runtime, job = printed(capsys, *ASKED)
    assert all_problems(runtime, job) == []
    assert (runtime["kind"], job["kind"]) == ("ClusterTrainingRuntime", "TrainJob")
    assert runtime["metadata"]["name"] == "hvdtrain-cpu" and "namespace" not in runtime["metadata"]
    assert job["metadata"] == {"name": "digits", "namespace": "ml",
                               "labels": {"kueue.x-k8s.io/queue-name": "team-a"}}
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 3, "mpi": {
        "numProcPerNode": 2, "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": "/home/mpiuser/.ssh", "runLauncherAsNode": False}}
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"], trainer["image"]) == (
        3, 2, "hvdtrain:latest")
    # The MPIJob's launcher line: Trainer mounts its hostfile at the same path.
    assert trainer["command"] + trainer["args"] == [
        "hvdtrain", "launch", "hostfile", "-f", "/etc/mpi/hostfile", "-i", "net1", "--",
        "--preset", "digits", "--set", "train.epochs=3", "--run-dir", "/runs/digits", "--resume"]
    template = runtime["spec"]["template"]["spec"]
    jobs = {r["name"]: r for r in template["replicatedJobs"]}
    node = jobs["node"]["template"]["spec"]["template"]["spec"]
    assert node["containers"][0]["readinessProbe"]["tcpSocket"] == {"port": 2222}
    assert node["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "8Gi"}
    assert [v["name"] for v in node["volumes"]] == ["runs", "shm"]
    assert node["tolerations"] == [{"key": "spot", "operator": "Exists", "effect": "NoExecute"}]
    # The launcher waits for ready workers; a user error (exit 2) fails the job, not retried.
    assert jobs["launcher"]["dependsOn"] == [{"name": "node", "status": "Ready"}]
    launcher = jobs["launcher"]["template"]["spec"]
    assert launcher["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [2]
    assert launcher["backoffLimit"] == 3
    assert template["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}
    assert template["ttlSecondsAfterFinished"] == 86400
    assert runtime["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 60}}


def broken(runtime: dict, job: dict, how: str) -> tuple[dict, dict]:
    runtime, job = copy.deepcopy(runtime), copy.deepcopy(job)
    jobs = {r["name"]: r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    launcher = jobs["launcher"]["template"]
    if how == "misspelt field":
        job["spec"]["trainer"]["numNode"] = job["spec"]["trainer"].pop("numNodes")
    elif how == "wrong type":
        runtime["spec"]["mlPolicy"]["mpi"]["numProcPerNode"] = "two"
    elif how == "container not named node":
        launcher["spec"]["template"]["spec"]["containers"][0]["name"] = "launcher"
    elif how == "launcher not the trainer step":
        launcher["metadata"]["labels"] = {}
    elif how == "failure policy with OnFailure":
        launcher["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    elif how == "reserved env":
        job["spec"]["trainer"]["env"] = [{"name": "OMPI_MCA_plm_rsh_args", "value": "-v"}]
    return runtime, job


@pytest.mark.parametrize("how", ["misspelt field", "wrong type", "container not named node",
                                 "launcher not the trainer step",
                                 "failure policy with OnFailure", "reserved env"])
def test_control_each_broken_document_fails_the_check(capsys, how):
    runtime, job = printed(capsys, *ASKED)
    assert len(all_problems(*broken(runtime, job, how))) == 1, how


def test_trainers_hostfile_names_each_node_pod():
    # JobSet's pod names under the TrainJob's subdomain, as Trainer's MPI plugin writes them.
    assert trainjob.hostfile("digits", 2, 4) == ["digits-node-0-0.digits slots=4",
                                                 "digits-node-0-1.digits slots=4"]
    assert trainjob.launcher_env("/etc/mpi/hostfile", 4)["OMPI_MCA_orte_set_default_slots"] == "4"


@pytest.mark.fault
@pytest.mark.parametrize("args, expected", [
    (["--queue", "q1"], "--queue is the MPI Operator's (Volcano)"),
    (["--runtime", "Bad_Name"], "--runtime 'Bad_Name' must be a DNS label"),
    (["--", "--preset", "nosuch"], "unknown preset"),
])
def test_bad_input_is_one_line(capsys, args, expected):
    assert cli.run(["launch", "k8s", "--format", "trainjob", "--image", "hvdtrain:latest",
                    "--workers", "2", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hvdtrain: error: ") and expected in err[0], err
