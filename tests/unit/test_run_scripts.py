"""The launch scripts: usage, input checks before anything launches, and the commands they build
(--dry-run). Real launches through them: local.sh here, test_multihost.py, test_slurm.py, the
elastic tests (test_faults_elastic.py)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import ROOT, assert_ok, launcher_env, run_job
from hvdtrain import version
from hvdtrain.launch import launchers, rank_process

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

SCRIPTS = ROOT / "run_scripts"
ALL = [script.file for script in launchers.SCRIPTS.values()]  # each launcher's own among them


def script(name: str, *args: str, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPTS / name), *args], capture_output=True, text=True,
                          timeout=60, env={**launcher_env(), **(env or {})},
                          stdin=subprocess.DEVNULL)


def assert_refused(done: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 2 with one error line naming the problem, and nothing launched."""
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("run_scripts/") and ": error: " in lines[-1], done.stderr
    for word in words:
        assert word in lines[-1], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize("user_level", [None, "0"])
def test_scripts_quiet_tensorflow_as_hvdtrain_does_and_a_user_level_wins(user_level):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if user_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = user_level
    shell = f'source "{SCRIPTS}/_lib.sh"; echo "$TF_CPP_MIN_LOG_LEVEL"'
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60,
                          env=env)
    expected = user_level or rank_process.QUIET_TENSORFLOW["TF_CPP_MIN_LOG_LEVEL"]
    assert done.stdout.strip() == expected, done


@pytest.mark.parametrize("name", ALL)
def test_help(name):
    done = script(name, "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: "), done
    assert f"run_scripts/{name}" in done.stdout


@pytest.fixture
def hostfile(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "hosts"
        path.write_text(text)
        return str(path)
    return write


@pytest.mark.parametrize("text, ranks, words", [
    (None, [], ["does not exist"]),
    ("", [], ["names no host"]),
    ("# only a comment\n", [], ["names no host"]),
    ("nodeA slots=two\n", [], ["line 1", "positive integer", "'two'"]),
    ("nodeA slots=2\nnodeB 4\n", [], ["line 2", "HOST slots=N"]),
    ("nodeA:0\n", [], ["line 1", "positive integer"]),
    ("nodeA slots=2\nnodeB:1\n", ["-n", "4"], ["4 ranks", "only 3 slots"]),
    ("nodeA slots=2\n", ["-n", "x"], ["positive integer", "'x'"]),
    ("nodeA slots=2\n", ["-b", "everything"], ["--bind", "'everything'"]),
    ("nodeA slots=2\n", ["--frobnicate"], ["unknown option --frobnicate"]),
])
def test_mpirun_hostfile_refuses_bad_input(hostfile, tmp_path, text, ranks, words):
    path = hostfile(text) if text is not None else str(tmp_path / "missing")
    assert_refused(script("mpirun_hostfile.sh", "-f", path, *ranks), *words)


def test_mpirun_hostfile_needs_a_hostfile():
    assert_refused(script("mpirun_hostfile.sh", "--", "--epochs", "1"), "hostfile is required")


def test_mpirun_hostfile_builds_the_command(hostfile):
    path = hostfile("# cluster\nnodeA slots=2 max_slots=4\n\nnodeB:2  # horovodrun form\n")
    done = script("mpirun_hostfile.sh", "-f", path, "-i", "ens5", "-x", "MY_SETTING",
                  "--dry-run", "--", "--preset", "digits", "--epochs", "3",
                  env={"MY_SETTING": "1", "HOROVOD_CYCLE_TIME": "1"})
    assert done.returncode == 0, done
    words = done.stdout.split()
    assert words[:3] == ["mpirun", "-np", "4"]       # all slots: 2 + 2
    assert words[words.index("--hostfile") + 1] == path
    assert words[words.index("--bind-to") + 1] == "none"
    exported = {words[i + 1] for i, w in enumerate(words) if w == "-x"}
    assert {"PATH", "MY_SETTING", "HOROVOD_CYCLE_TIME"} <= exported
    assert "btl_tcp_if_include ens5" in done.stdout and "oob_tcp_if_include ens5" in done.stdout
    assert done.stdout.split("hvdtrain train", 1)[1].split() == ["--preset", "digits",
                                                                  "--epochs", "3"]


@pytest.mark.parametrize("args, words", [
    ([], ["give the number of ranks"]),
    (["two"], ["positive integer", "'two'"]),
    (["0"], ["positive integer"]),
])
def test_local_refuses_bad_input(args, words):
    assert_refused(script("local.sh", *args), *words)


def test_local_refuses_an_unknown_controller():
    assert_refused(script("local.sh", "2", env={"CONTROLLER": "nccl"}),
                   "CONTROLLER must be mpi or gloo", "'nccl'")


@pytest.mark.multirank
@pytest.mark.smoke
@pytest.mark.parametrize("controller", ["", "gloo"], ids=["default-mpi", "gloo"])
def test_local_launches_n_ranks_for_real(controller, tmp_path):
    # The README's one-machine command, run as a user would: from the checkout, the venv's
    # bin on PATH (make does that), 2 ranks of a one-epoch job; over MPI by default where
    # mpirun is installed (it is here), over Gloo when asked.
    run_dir = tmp_path / "run"
    job = run_job([str(SCRIPTS / "local.sh"), "2", "--preset", "synthetic-mlp", "--epochs", "1",
                   "--set", "run.tensorboard=false", "--set", "run.export=false",
                   "--run-dir", str(run_dir)], cwd=SCRIPTS.parent, timeout=120,
                  env={"CONTROLLER": controller} if controller else None)
    assert_ok(job, "run_scripts/local.sh 2")
    expected = controller or "mpi"
    # Tagged as the launcher of that controller tags (horovodrun --mpi runs mpirun --tag-output).
    tag = next(row.rank_tag(0) for row in launchers.LAUNCHERS.values()
               if row.controller == expected)
    assert f"{tag}hvdtrain {version.describe()}: 2 ranks ({expected})" in job.output, job.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["controller"], summary["epochs"]) == (2, expected, 1)
    assert summary["hvdtrain_version"] == version.describe()  # the banner's string


def test_slurm_refuses_to_run_outside_an_allocation():
    env = {k: "" for k in os.environ if k.startswith("SLURM_")}
    assert_refused(script("slurm.sbatch", env=env), "not inside a SLURM allocation")


@pytest.mark.parametrize("launcher, first", [("srun", ["srun", "--mpi=pmix"]),
                                             ("mpirun", ["mpirun", "-np", "8"])])
def test_slurm_builds_the_command(launcher, first):
    env = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "8", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_NODELIST": "gpu[01-02]", "LAUNCHER": launcher}
    done = script("slurm.sbatch", "--dry-run", "--epochs", "3", env=env)
    assert done.returncode == 0, done
    banner, command = done.stdout.strip().splitlines()
    assert "8 tasks on 2 nodes (gpu[01-02])" in banner
    assert command.split()[:len(first)] == first
    assert command.split()[-4:] == ["hvdtrain", "train", "--epochs", "3"]


def test_slurm_refuses_an_unknown_launcher():
    env = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "8", "LAUNCHER": "pdsh"}
    assert_refused(script("slurm.sbatch", "--dry-run", env=env), "srun or mpirun", "'pdsh'")


@pytest.fixture
def discovery(tmp_path):
    def write(body: str, executable: bool = True) -> str:
        path = tmp_path / "discover.sh"
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755 if executable else 0o644)
        return str(path)
    return write


def test_elastic_builds_the_command(discovery):
    found = discovery("echo localhost:2; echo otherhost:1")
    done = script("elastic.sh", "--min-np", "2", "--max-np", "3", "-d", found, "-i", "eth1",
                  "-t", "60", "--dry-run", "--", "--preset", "digits-mlp")
    assert done.returncode == 0, done
    # With an interface, horovodrun and every rank run under hvdtrain.listeners (Horovod's
    # listeners bound to it), with hvdtrain's Python.
    bound = [launchers.BIN.joinpath("python").as_posix(), "-m", "hvdtrain.listeners"]
    assert done.stdout.split() == [
        *bound, "horovodrun", "-np", "2", "--min-np", "2", "--max-np", "3",
        "--host-discovery-script", found, "--network-interface", "eth1",
        "--elastic-timeout", "60", *bound, launchers.BIN.joinpath("hvdtrain").as_posix(),
        "train", "--elastic",
        "--preset", "digits-mlp"]
    # Without one, Horovod's own launcher and hvdtrain as they are.
    plain = script("elastic.sh", "--min-np", "2", "--max-np", "3", "-d", found, "--dry-run")
    assert plain.stdout.split()[0] == "horovodrun" and "hvdtrain.listeners" not in plain.stdout


def test_elastic_takes_a_discovery_command_with_arguments(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    discover = f"{SCRIPTS / 'discover_hosts.sh'} {hosts}"
    done = script("elastic.sh", "--min-np", "1", "--max-np", "2", "-d", discover, "--dry-run")
    assert done.returncode == 0, done
    assert discover.replace(" ", "\\ ") in done.stdout   # one argument for horovodrun


@pytest.mark.parametrize("args, body, words", [
    (["--max-np", "3"], "echo localhost:3", ["--min-np", "positive integer"]),
    (["--min-np", "3", "--max-np", "2"], "echo localhost:3", ["larger than --max-np"]),
    (["--min-np", "1", "--max-np", "2", "-n", "3"], "echo localhost:3", ["outside 1..2"]),
    (["--min-np", "2", "--max-np", "3"], "echo localhost:1", ["lists 1 slots", "2 ranks"]),
    (["--min-np", "2", "--max-np", "3"], "echo 'localhost slots'", ["output of", "line 1"]),
    (["--min-np", "2", "--max-np", "3"], "true", ["names no host"]),
    (["--min-np", "2", "--max-np", "3"], "exit 3", ["failed"]),
    (["--min-np", "2", "--max-np", "3", "-t", "soon"], "echo localhost:3", ["--timeout"]),
])
def test_elastic_refuses_bad_input(discovery, args, body, words):
    assert_refused(script("elastic.sh", *args, "-d", discovery(body)), *words)


def test_elastic_refuses_a_missing_or_non_executable_discovery_script(discovery, tmp_path):
    assert_refused(script("elastic.sh", "--min-np", "1", "--max-np", "2"), "required")
    assert_refused(script("elastic.sh", "--min-np", "1", "--max-np", "2", "-d",
                          str(tmp_path / "nope")), "does not exist")
    assert_refused(script("elastic.sh", "--min-np", "1", "--max-np", "2", "-d",
                          discovery("echo localhost:2", executable=False)), "not executable")


def test_discover_hosts_prints_horovodrun_lines(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# workers\nnode1:4\n\n  node-2.local slots=2  # the second\n127.0.0.1")
    done = script("discover_hosts.sh", str(hosts))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["node1:4", "node-2.local:2", "127.0.0.1:1"]
    from_env = script("discover_hosts.sh", env={"HVDTRAIN_HOSTS_FILE": str(hosts)})
    assert from_env.stdout == done.stdout


@pytest.mark.parametrize("text, words", [
    ("node1:4\nnode2 4\n", ["line 2", "HOST slots=N"]),
    ("node1:4\nnode3:0\n", ["line 2", "positive integer"]),
])
def test_discover_hosts_prints_nothing_for_a_bad_file(tmp_path, text, words):
    hosts = tmp_path / "hosts"
    hosts.write_text(text)
    assert_refused(script("discover_hosts.sh", str(hosts)), *words)


def test_discover_hosts_needs_a_readable_file(tmp_path):
    assert_refused(script("discover_hosts.sh", str(tmp_path / "nope")), "does not exist")
    assert_refused(script("discover_hosts.sh", env={"HVDTRAIN_HOSTS_FILE": ""}), "no hosts file")


def test_the_mpirun_hvdtrain_starts_kills_a_failed_jobs_other_ranks_at_once():
    # hvdtrain's own launches (bench, doctor, the tests' jobs): Open MPI's default waits a
    # second between the SIGTERM and the SIGKILL of the ranks left when one fails.
    command = launchers.launch_command("mpi", 2, ["hvdtrain", "train"])
    at = command.index("odls_base_sigkill_timeout")
    assert command[at - 1:at + 2] == ["--mca", "odls_base_sigkill_timeout", "0"]
    assert command.index("-np") < at < command.index("hvdtrain")   # mpirun's, not the rank's
