"""Faults: a rank killed mid-training (then --resume), a rank killed while rank 0 writes a
checkpoint, and a stalled rank that Horovod's stall check (or hvdtrain's watchdog) ends the job
for."""
from __future__ import annotations

import re
import sys

import pytest

from fault_jobs import QUICK, kill_rank, rank_is, run_and_act, summary_of
from helpers import (assert_ok, hvdtrain, importable_from, launch, launch_command,
                     rank_status)
from hvdtrain.launch import launchers
from hvdtrain.training import checkpoints

pytestmark = [pytest.mark.multirank, pytest.mark.fault, pytest.mark.beside]

BAR = 0.95      # eval accuracy of the digits CNN after 10 epochs (test_multirank: 5 suffice)
# The README: a killed rank takes every process of the job with it (measured beside make test's
# main lane: 1.1 s under mpirun, 0.3 s under horovodrun).
GONE_WITHIN_S = 10


# ---------------------------------------------------------------------------------------------
# A rank killed (SIGKILL) mid-training, then --resume.

def test_killed_rank_stops_the_job_and_resume_reaches_the_bar(launcher, tmp_path):
    run_dir = tmp_path / "run"
    cnn = [*QUICK, "--preset", "digits"]
    args = hvdtrain("train", *cnn, "--epochs", "10", "--run-dir", str(run_dir))
    killed = run_and_act(launch_command(launcher, 2, args, tag_output=True), r"epoch +3/10",
                         kill_rank(rank_is(launcher, 1)))
    print(f"every process of the job gone {killed.gone_s:.1f} s after the kill")
    status_line = launchers.entry(launcher).rank_status_line
    assert killed.status != 0 and killed.gone_s < GONE_WITHIN_S, (killed.gone_s,
                                                                 killed.output[-3000:])
    named = (rank_status(status_line, 137, rank=1) if status_line
             else r"process rank 1 with PID \d+ on node \S+ exited on signal 9")
    assert re.search(named, killed.output), killed.output[-3000:]
    if status_line:   # the launcher lets the other ranks notice the loss (horovodrun)
        # Rank 0, waiting in a collective, notices the lost peer at once: it says so and exits
        # with status 1 (horovodrun reports every rank's status).
        rank0 = re.escape(launchers.entry(launcher).rank_tag(0, "stderr"))
        assert re.search(rf"^{rank0}hvdtrain: error: rank 0: another rank died",
                         killed.output, re.M), killed.output[-3000:]
        # Then horovodrun reports rank 0's status 1, unless its own cleanup of the remaining
        # workers (after rank 1's failure) reaches rank 0 first: a race in horovodrun.
        assert ("Process 0 exit with status code 1." in killed.output
                or "Terminating remaining workers after failure of Process 1." in killed.output
                ), killed.output[-3000:]
    # (mpirun ends the other ranks itself, at once, with SIGTERM: before they notice.)
    assert not (run_dir / "summary.json").exists()

    resumed = launch(launcher, 2, hvdtrain("train", *cnn, "--epochs", "10", "--resume",
                                           "--run-dir", str(run_dir)))
    assert_ok(resumed, "resume")
    done = int(re.search(r"resuming \S+ after epoch (\d+)", resumed.output).group(1))
    # Rank 0 prints an epoch's line before it writes that epoch's checkpoint (callbacks.assemble).
    # Under Gloo it goes on to write it and then finds the peer gone; mpirun ends it at once,
    # maybe mid-write (the checkpoint is then not there at all): every epoch before the line.
    assert done >= (3 if status_line else 2), resumed.output[-2000:]
    summary = summary_of(run_dir)
    assert summary["resumed_from_epoch"] == done and summary["epochs"] == 10
    assert summary["final_eval_accuracy"] >= BAR, summary


KILLED_WHILE_WRITING = """
import sys, time
from hvdtrain import cli
from hvdtrain.training import checkpoints
original = checkpoints._write_json
def write_slowly(path, obj):
    if obj.get("epochs_done") == 3:  # the weights are written, meta.json is next
        print("hvdtrain-test: writing the checkpoint of epoch 3", flush=True)
        time.sleep(120)   # where the test kills this rank
    original(path, obj)
checkpoints._write_json = write_slowly
sys.exit(cli.run(sys.argv[1:]))
"""


def test_a_rank_killed_while_rank_0_writes_a_checkpoint_keeps_the_previous_one(tmp_path):
    # mpirun, 2 ranks: rank 0 (the writer) is SIGKILLed half-way through epoch 3's checkpoint.
    run_dir = tmp_path / "run"
    script = tmp_path / "slow_write.py"
    script.write_text(KILLED_WHILE_WRITING)
    args = ["train", *QUICK, "--epochs", "4", "--run-dir", str(run_dir)]
    killed = run_and_act(launch_command("mpi", 2, [sys.executable, str(script), *args]),
                         r"writing the checkpoint of epoch 3",
                         kill_rank(rank_is("mpi", 0), program=script.name))
    assert killed.status != 0 and killed.gone_s < GONE_WITHIN_S, (killed.gone_s,
                                                                 killed.output[-3000:])
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept[1:] == ["epoch-0001", "epoch-0002"] and kept[0].startswith(".epoch-0003.tmp-")
    assert (run_dir / "checkpoints" / kept[0] / "ckpt.index").exists()  # really half-written
    assert checkpoints.latest(run_dir)[0] == 2

    resumed = launch("mpi", 2, hvdtrain(*args, "--resume"))
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
from hvdtrain.launch import placement

RANK = placement.launcher_rank()


class HangsOnRankOne(tf.keras.layers.Layer):
    steps = 0

    def call(self, x):
        def maybe_hang(t):
            HangsOnRankOne.steps += 1
            if RANK == 1 and HangsOnRankOne.steps == 30:  # rank 1 stops submitting collectives
                with open(os.environ["STALLED_AT"], "w") as mark:
                    mark.write(repr(time.time()))
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
STALL_ABORT_S = 6
# After run.stall_abort_s: the stall check's own period (run.stall_warning_s under MPI), then
# the launcher's teardown. Measured from the stall to the launcher's exit on 2 cores: 7 s
# (Gloo), 13 s (MPI), 23 s (MPI at a load of 5.6); beside make test's main lane 6.6 s (Gloo)
# and 10.3 s (MPI).
STALL_SLACK_S = 30


def test_a_stalled_rank_aborts_the_job_within_the_stall_bound(launcher, tmp_path):
    (tmp_path / "stalls.py").write_text(STALLS)
    stalled_at = tmp_path / "stalled_at"
    job = launch(launcher, 2, hvdtrain("train", *QUICK, "--model", "stalls:build",
                                       "--epochs", "5", "--run-dir", str(tmp_path / "run"),
                                       "--set", "run.stall_warning_s=2",
                                       "--set", f"run.stall_abort_s={STALL_ABORT_S}"),
                 env={**importable_from(tmp_path), "STALLED_AT": str(stalled_at)}, timeout=90)
    assert job.returncode != 0 and not job.leftovers, job.output[-3000:]
    assert stalled_at.exists(), f"the job ended before rank 1 stalled:\n{job.output[-3000:]}"
    seconds = job.finished_at - float(stalled_at.read_text())
    print(f"the job ended {seconds:.1f} s after rank 1 stalled")
    assert STALL_ABORT_S <= seconds < STALL_ABORT_S + STALL_SLACK_S, job.output[-3000:]
    if launchers.entry(launcher).controller == "mpi":
        # Horovod's report names the rank that did not submit (1, marked "!") and an
        # all-reduce of the step it missed: the reducer's check of the missing gradients
        # (reducer.places_check, which needs no gradient: rank 1 may have sent it before its
        # forward pass stalled), or the gradients' own.
        assert "Missing ranks:" in job.output, job.output[-3000:]
        assert re.search(r"^1!: \[\S*(hvdtrain_update_places|hvdtrain_gradients)", job.output,
                         re.M), \
            job.output[-3000:]
        assert f"stalled for longer than {STALL_ABORT_S} seconds" in job.output
        assert "another rank died or stalled" in job.output
    else:
        # Under Gloo, Horovod's stall check does nothing (measured with 0.28.1): hvdtrain's own
        # watchdog ends the waiting ranks; it cannot tell which rank stalled.
        assert "Missing ranks:" not in job.output
        assert re.search(rf"rank \d: no training step finished in {STALL_ABORT_S} s",
                         job.output), job.output
