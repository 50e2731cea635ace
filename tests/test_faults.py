"""Faults: a rank killed or stalled mid-training, elastic training losing and gaining workers,
a kill during a checkpoint write, and bad input met during training (a diverging loss, a full or
read-only run directory, ranks with different configs, a checkpoint of another model)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN, hvdtrain, launch, launch_command, launcher_env
from test_multirank import _snapshot, assert_ok

pytestmark = [pytest.mark.multirank, pytest.mark.fault]

QUICK = ["--preset", "digits-mlp", "--set", "run.tensorboard=false", "--set", "run.export=false"]
BAR = 0.95      # eval accuracy of the digits CNN after 10 epochs (test_multirank: 5 suffice)
MLP_BAR = 0.93  # digits-mlp's final eval accuracy swings by 2 to 3 points between epochs


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def rank_pid(launcher_pid: int, variable: str) -> int:
    """The pid of the hvdtrain rank started by ``launcher_pid`` (other jobs may run on this
    machine) whose environment holds ``variable`` (e.g. HOROVOD_RANK=1)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if (b"bin/hvdtrain" in cmdline and b"horovodrun" not in cmdline
                and variable.encode() in environ and descends_from(int(entry), launcher_pid)):
            return int(entry)
    raise AssertionError(f"no hvdtrain rank with {variable} under pid {launcher_pid}")


def kill_rank(variable: str):
    """An action for run_and_act: SIGKILL the launched job's rank with ``variable``."""
    return lambda proc: os.kill(rank_pid(proc.pid, variable), signal.SIGKILL)


def run_and_act(command: list[str], trigger: str, act, timeout: float = 300):
    """Runs ``command``, calls ``act(process)`` once a line matches ``trigger``; returns
    (exit status, output, seconds from the action to the exit)."""
    proc = subprocess.Popen(command, env=launcher_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    lines, acted_at = [], None
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line)
            if acted_at is None and re.search(trigger, line):
                act(proc)
                acted_at = time.monotonic()
            assert time.monotonic() < deadline, "".join(lines[-50:])
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert acted_at is not None, f"never saw {trigger!r}:\n{''.join(lines[-50:])}"
    return proc.returncode, "".join(lines), time.monotonic() - acted_at


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# ---------------------------------------------------------------------------------------------
# A rank killed (SIGKILL) mid-training, then --resume.

def test_killed_rank_stops_the_job_and_resume_reaches_the_bar(launcher, tmp_path):
    run_dir = tmp_path / "run"
    cnn = [*QUICK, "--preset", "digits"]
    args = hvdtrain("train", *cnn, "--epochs", "10", "--run-dir", str(run_dir))
    variable = "HOROVOD_RANK=1" if launcher == "gloo" else "OMPI_COMM_WORLD_RANK=1"
    status, output, seconds = run_and_act(
        launch_command(launcher, 2, args), r"epoch +3/10",
        kill_rank(variable))
    assert status != 0 and seconds < 60, (status, seconds, output[-3000:])
    named = (r"Process 1 exit with status code 137" if launcher == "gloo"
             else r"process rank 1 with PID \d+ on node \S+ exited on signal 9")
    assert re.search(named, output), output[-3000:]
    assert not (run_dir / "summary.json").exists()

    resumed = launch(launcher, 2, hvdtrain("train", *cnn, "--epochs", "10", "--resume",
                                           "--run-dir", str(run_dir)))
    assert_ok(resumed, "resume")
    done = int(re.search(r"resuming \S+ after epoch (\d+)", resumed.output).group(1))
    assert done >= 3  # at least the epochs printed before the kill were checkpointed
    summary = summary_of(run_dir)
    assert summary["resumed_from_epoch"] == done and summary["epochs"] == 10
    assert summary["final_eval_accuracy"] >= BAR, summary


KILL_DURING_CHECKPOINT = """
import os, signal, sys
from hvdtrain import checkpoints, cli
original = checkpoints._write_json
def write_then_die(path, obj):
    if obj.get("epochs_done") == 3:  # the weights are written, meta.json is next: die now
        os.kill(os.getpid(), signal.SIGKILL)
    original(path, obj)
checkpoints._write_json = write_then_die
sys.exit(cli.run(sys.argv[1:]))
"""


def test_kill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    run_dir = tmp_path / "run"
    script = tmp_path / "die_mid_write.py"
    script.write_text(KILL_DURING_CHECKPOINT)
    args = ["train", *QUICK, "--epochs", "4", "--run-dir", str(run_dir)]
    killed = launch("single", 1, [sys.executable, str(script), *args])
    assert killed.returncode == -signal.SIGKILL, killed.output[-3000:]
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept[1:] == ["epoch-0001", "epoch-0002"] and kept[0].startswith(".epoch-0003.tmp-")
    assert (run_dir / "checkpoints" / kept[0] / "ckpt.index").exists()  # really half-written

    resumed = launch("single", 1, hvdtrain(*args, "--resume"))
    assert_ok(resumed, "resume")
    assert "after epoch 2" in resumed.output
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["epoch-0002", "epoch-0003", "epoch-0004"]  # the leftover is gone
    assert summary_of(run_dir)["epochs"] == 4


# ---------------------------------------------------------------------------------------------
# A stalled rank: Horovod's stall check ends the job.

STALLS = """
import os, time
import tensorflow as tf

RANK = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


class HangsOnRankOne(tf.keras.layers.Layer):
    steps = 0

    def call(self, x):
        def maybe_hang(t):
            HangsOnRankOne.steps += 1
            if RANK == "1" and HangsOnRankOne.steps == 30:  # rank 1 stops submitting collectives
                time.sleep(3600)
            return t
        y = tf.py_function(maybe_hang, [x], tf.float32)
        y.set_shape(x.shape)
        return y


def build(input_shape, num_classes):
    inputs = tf.keras.Input(input_shape)
    x = HangsOnRankOne()(tf.keras.layers.Flatten()(inputs))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x))
"""


def test_a_stalled_rank_aborts_the_job_within_the_stall_bound(launcher, tmp_path):
    (tmp_path / "stalls.py").write_text(STALLS)
    job = launch(launcher, 2, hvdtrain("train", *QUICK, "--model", "stalls:build",
                                       "--epochs", "5", "--run-dir", str(tmp_path / "run"),
                                       "--set", "run.stall_warning_s=2",
                                       "--set", "run.stall_abort_s=6"),
                 env={"PYTHONPATH": str(tmp_path)}, timeout=90)
    assert job.returncode != 0 and job.seconds < 60, job.output[-3000:]
    if launcher == "mpi":
        # Horovod's report names the rank that did not submit (1, marked "!") and the gradient
        # all-reduce it missed (Keras 2: Horovod's per-tensor names; Keras 3: hvdtrain's
        # grouped all-reduce).
        assert "Missing ranks:" in job.output, job.output[-3000:]
        assert re.search(r"^1!: \[\S*(Allreduce|hvdtrain_gradients)", job.output, re.M), \
            job.output[-3000:]
        assert "stalled for longer than 6 seconds" in job.output
        assert "another rank died or stalled" in job.output
    else:
        # Under Gloo, Horovod's stall check does nothing (measured with 0.28.1): hvdtrain's own
        # watchdog ends the waiting ranks; it cannot tell which rank stalled.
        assert "Missing ranks:" not in job.output
        assert re.search(r"rank \d: no training step finished in 6 s", job.output), job.output


# ---------------------------------------------------------------------------------------------
# Elastic training on localhost: "localhost" and "127.0.0.1" are two hosts to Horovod, so one
# can fail or arrive while the other goes on.

def elastic_command(hosts: Path, np_: int, run_dir: Path, *args: str) -> list[str]:
    """Through the launch scripts users run: run_scripts/elastic.sh with discover_hosts.sh."""
    scripts = Path(__file__).parent.parent / "run_scripts"
    return [str(scripts / "elastic.sh"), "-n", str(np_), "--min-np", "2", "--max-np", "3",
            "-d", f"{scripts / 'discover_hosts.sh'} {hosts}", "-i", "lo", "-t", "60",
            "--", *QUICK, "--run-dir", str(run_dir), *args]


def test_elastic_goes_on_without_a_killed_worker(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n127.0.0.1:1\n")
    run_dir = tmp_path / "run"
    status, output, _ = run_and_act(
        elastic_command(hosts, 3, run_dir, "--epochs", "8"), r"epoch +2/8",
        kill_rank("HOROVOD_HOSTNAME=127.0.0.1"))
    assert status == 0, output[-4000:]
    assert re.search(r"elastic: now 2 ranks \(was 3\), going on from epoch [23]", output), output
    summary = summary_of(run_dir)
    assert summary["elastic_world_sizes"] == [3, 2] and summary["world_size"] == 2
    assert summary["final_eval_accuracy"] >= MLP_BAR, summary


def test_elastic_takes_in_an_added_worker_at_the_next_commit(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    run_dir = tmp_path / "run"
    # Small batches make epochs long enough for the new worker to start before the end.
    status, output, _ = run_and_act(
        elastic_command(hosts, 2, run_dir, "--epochs", "12", "--batch-size", "8",
                        "--lr", "0.0125"), r"epoch +1/12",
        lambda _: hosts.write_text("localhost:2\n127.0.0.1:1\n"))
    assert status == 0, output[-4000:]
    joined = re.search(r"elastic: now 3 ranks \(was 2\), going on from epoch (\d+), peak lr "
                       r"([\d.]+)", output)
    assert joined, output[-4000:]
    assert float(joined.group(2)) == pytest.approx(0.0125 * 3)  # lr scaled for 3 ranks
    summary = summary_of(run_dir)
    assert summary["elastic_world_sizes"] == [2, 3] and summary["world_size"] == 3
    assert summary["final_eval_accuracy"] >= MLP_BAR, summary
    # Every epoch was logged, the ones retried after the join once more.
    epochs = {json.loads(line)["epoch"] for line in
              (run_dir / "metrics.jsonl").read_text().splitlines()}
    assert epochs == set(range(1, 13))


# ---------------------------------------------------------------------------------------------
# Bad input met during training: one line, non-zero exit on every rank, the run dir intact.

def one_error_line(job) -> str:
    errors = [line for line in job.output.splitlines() if "hvdtrain: error:" in line]
    assert len(errors) == 1, job.output[-4000:]
    assert job.returncode != 0 and job.seconds < 90
    assert not re.search(r"^\[\d+\]<std(out|err)>:Traceback", job.output, re.M), job.output
    return errors[0]


def resume_that_fails(launcher: str, run_dir: Path, epochs: int, *resume_args: str):
    """Trains ``epochs`` epochs, then resumes with ``resume_args``, which must fail; returns
    (its error line, the run dir's files before, after)."""
    assert_ok(launch(launcher, 2, hvdtrain("train", *QUICK, "--epochs", str(epochs),
                                           "--run-dir", str(run_dir))), f"{epochs} epochs")
    before = _snapshot(run_dir)
    job = launch(launcher, 2, hvdtrain("train", *QUICK, "--resume", *resume_args,
                                       "--run-dir", str(run_dir)))
    return one_error_line(job), before, _snapshot(run_dir)


def test_a_diverging_loss_stops_and_keeps_the_last_good_checkpoint(launcher, tmp_path):
    error, before, after = resume_that_fails(launcher, tmp_path / "run", 2,
                                             "--epochs", "4", "--lr", "1e6")
    assert re.search(r"training diverged: the loss is (nan|inf) in epoch 3", error), error
    assert "epoch-0002" in error
    # No checkpoint and no metrics of the bad epoch (config.json holds the lr just tried).
    del before["config.json"], after["config.json"]
    assert after == before


def tmpfs(path: Path, size: str, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]),
                           "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


@pytest.fixture
def small_disk(tmp_path):
    mounts: list[Path] = []

    def make(size: str, *options: str) -> Path:
        path = tmp_path / f"disk{len(mounts)}"
        tmpfs(path, size, *options)
        mounts.append(path)
        return path
    yield make
    for path in mounts:
        subprocess.run(["umount", str(path)], check=False)


def test_a_full_run_dir_stops_every_rank_and_keeps_the_checkpoints(launcher, small_disk):
    # 200 KiB: the config and the first checkpoints fit, the disk fills a few epochs later.
    disk = small_disk("200k")
    run_dir = disk / "run"
    job = launch(launcher, 2, hvdtrain("train", *QUICK, "--epochs", "20",
                                       "--set", "run.keep_checkpoints=20",
                                       "--run-dir", str(run_dir)))
    error = one_error_line(job)
    assert "cannot write checkpoint" in error and "No space left on device" in error, error
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names and all(n.startswith("epoch-") for n in names)  # no half-written one
    from hvdtrain import checkpoints
    assert checkpoints.latest(run_dir)[0] == len(names)


def test_a_read_only_run_dir_is_refused_before_training(launcher, small_disk):
    disk = small_disk("1m", "ro")
    job = launch(launcher, 2, hvdtrain("train", *QUICK, "--run-dir", str(disk / "run")))
    error = one_error_line(job)
    assert f"cannot create run dir {disk / 'run'}: Read-only file system" in error, error


def test_ranks_started_with_different_configs_are_stopped(launcher, tmp_path):
    # A config file that differs between hosts, played here by each rank's own lr.
    rank = "${HOROVOD_RANK:-$OMPI_COMM_WORLD_RANK}"
    command = f"exec {BIN / 'hvdtrain'} train {' '.join(QUICK)} --lr 0.0$((1 + {rank})) " \
              f"--run-dir {tmp_path / 'run'}"
    job = launch(launcher, 2, ["bash", "-c", command])
    error = one_error_line(job)
    assert re.search(r"the config differs from rank 0's \(hash \w+ vs \w+, in optim\.lr\)", error)
    assert "(on rank 1)" in error
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_of_another_model_is_refused(launcher, tmp_path):
    error, before, after = resume_that_fails(launcher, tmp_path / "run", 1,
                                             "--model", "cnn", "--epochs", "2")
    assert "does not fit this model and optimizer" in error, error
    assert after == before
