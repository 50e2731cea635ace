"""Real multi-rank runs: 2 ranks under horovodrun --gloo and under mpirun, on CPU."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import (EXACT, RESUME_ARGS, assert_ok, assert_stopped_with_one_line,
                     exported_model, hvdtrain, importable_from, largest_difference, launch,
                     launcher_turns, snapshot, weights, worker, write_records)
from hvdtrain.launch import launchers

pytestmark = [pytest.mark.multirank, pytest.mark.core]


@pytest.mark.smoke
def test_weights_identical_on_every_rank_and_eval_is_exact(launcher, tmp_path):
    # Rank 1 starts from different weights: only the broadcast from rank 0 makes them agree.
    job = launch(launcher, 2, worker(tmp_path / "out", "--perturb-nonroot", *EXACT,
                                     "--set", f"run.run_dir={tmp_path / 'run'}",
                                     "--set", "train.epochs=3"))
    assert_ok(job, "2-rank training")
    rank0, rank1 = weights(tmp_path / "out/rank0.npz"), weights(tmp_path / "out/rank1.npz")
    assert len(rank0) == len(rank1) > 0
    for a, b in zip(rank0, rank1):
        np.testing.assert_array_equal(a, b)

    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["controller"] == launchers.entry(launcher).controller
    # 67 eval samples split 34/33 over the ranks: the reported accuracy is the exact one over
    # the whole set, not a mean of the two ranks' accuracies.
    assert summary["eval_samples"] == 67
    assert summary["final_eval_accuracy"] == pytest.approx(
        summary["whole_eval_set_accuracy"], abs=1e-9)
    assert summary["final_train_loss"] < np.log(10)  # below a uniform guess over 10 classes

    # hvdtrain's launch defaults were in every rank's environment when hvd.init() read it
    # (nothing in the test's environment sets them).
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"out/rank{rank}.env.json").read_text())
        assert seen == {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "0.2"}, rank


PLAIN_SGD = [*EXACT, "--set", "data.shuffle=false", "--set", "optim.momentum=0",
             "--set", "optim.lr_scaling=none", "--set", "optim.warmup_epochs=0",
             "--set", "optim.lr=0.1", "--set", "train.epochs=3"]


def plain_sgd_run(out: Path, launcher: str, ranks: int, batch: int, *extra: str):
    """Rank 0's final weights after PLAIN_SGD at ``batch`` per rank."""
    job = launch(launcher, ranks, worker(out, *PLAIN_SGD, *extra,
                                         "--set", f"train.batch_size={batch}",
                                         "--set", f"run.run_dir={out / 'run'}"))
    assert_ok(job, f"{ranks} x batch {batch}")
    return weights(out / "rank0.npz")


@pytest.fixture(scope="module")
def plain_sgd_references(tmp_path_factory) -> dict[str, list[np.ndarray]]:
    """One process at batch 32 (the 2-rank job's global batch), and the controls: one process
    at batch 16, and 2 ranks at batch 16 with the all-reduce left out (a wrapper that silently
    does nothing; what that gives does not depend on the launcher). The same for both
    launchers' tests, so run once."""
    runs = {"one rank": ("single", 1, 32), "one rank, half the batch": ("single", 1, 16),
            "not reduced": ("mpi", 2, 16, "--skip-allreduce")}
    return {name: plain_sgd_run(tmp_path_factory.mktemp("plain-sgd"), *run)
            for name, run in runs.items()}


@pytest.mark.either_launcher
def test_two_ranks_with_batch_b_equal_one_rank_with_batch_2b(launcher, plain_sgd_references,
                                                              tmp_path):
    two_ranks = plain_sgd_run(tmp_path, launcher, 2, 16, "--perturb-nonroot")
    one_rank = plain_sgd_references["one rank"]
    for a, b in zip(two_ranks, one_rank):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    # The check is sharp: without the all-reduce, or at half the global batch, the weights
    # end elsewhere.
    for control in ("not reduced", "one rank, half the batch"):
        assert largest_difference(plain_sgd_references[control], one_rank) > 1e-3, control


@pytest.mark.beside   # no bound on time: off the critical path
@pytest.mark.one_stack   # the optimizer's name is read by the config, the wrapper is the same
def test_adam_two_ranks_with_batch_b_equal_one_rank_with_batch_2b(tmp_path):
    adam = ["--set", "optim.name=adam", "--set", "optim.lr=0.01"]
    two_ranks = plain_sgd_run(tmp_path / "two", "mpi", 2, 16, "--perturb-nonroot", *adam)
    assert largest_difference(two_ranks, weights(tmp_path / "two" / "rank1.npz")) == 0
    one_rank = plain_sgd_run(tmp_path / "one", "single", 1, 32, *adam)
    close = largest_difference(two_ranks, one_rank)
    # Control: one rank at half the batch (what each rank would do alone) ends elsewhere.
    far = largest_difference(plain_sgd_run(tmp_path / "half", "single", 1, 16, *adam), one_rank)
    print(f"adam, 2 x 16 vs 1 x 32: {close:.1e}; 1 x 16 vs 1 x 32: {far:.1e}")
    assert close < 1e-4 and far > 100 * close, (close, far)


# Any launcher's tag (Entry.tag_pattern): a tag that does not start its line.
ANY_TAG = "|".join(filter(None, (row.tag_pattern for row in launchers.LAUNCHERS.values())))


def test_digits_with_two_ranks_through_the_cli(launcher, tmp_path):
    run_dir = tmp_path / "digits"
    # PYTHONUNBUFFERED, as many images set it: print() then writes a line's text and its
    # newline apart, and mpirun's --tag-output tagged each write (rank_process.whole_lines).
    job = launch(launcher, 2, hvdtrain("train", "--preset", "digits", "--epochs", "5",
                                       "--run-dir", str(run_dir)), tag_output=True,
                 env={"PYTHONUNBUFFERED": "1"})
    assert_ok(job, "hvdtrain train")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 5
    assert summary["eval_samples"] == 360
    assert summary["final_eval_accuracy"] >= 0.95, summary
    assert summary["final_train_loss"] < 0.5
    assert summary["train_samples_per_sec"] > 0 and summary["wall_seconds"] > 0

    # Rank 0 alone prints: one progress line per epoch, not one per rank; every line is tagged
    # with its rank (the control: rank 0's lines carry rank 0's tag), none with rank 1's.
    progress = re.findall(r"epoch +(\d+)/5 +loss", job.output)
    assert progress == ["1", "2", "3", "4", "5"], job.output
    # Rank r's lines as the launcher tags them (mpirun with --tag-output).
    rank0, rank1 = (launchers.entry(launcher).rank_tag(r) for r in (0, 1))
    assert all(line.startswith(rank0) for line in job.output.splitlines()
               if re.search(r"epoch +\d+/5 +loss", line)), job.output
    assert rank1 not in job.output, job.output
    # Whole lines: a launcher's tag starts a line, never ends one.
    assert not [line for line in job.output.splitlines()
                if re.search(f".({ANY_TAG})", line)], job.output
    # The launch defaults (0.2 ms cycle) in rank 0's banner: nothing else set them.
    assert f"{rank0}  horovod fusion 128 MB, cycle 0.2 ms, autotune off, timeline off" \
        in job.output.splitlines(), job.output

    # Rank 0 alone writes, and writes everything.
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2, 3, 4, 5]
    assert all("eval_accuracy" in m and "samples_per_sec" in m for m in metrics)
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["epoch-0003", "epoch-0004", "epoch-0005"]  # run.keep_checkpoints = 3
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert json.loads((run_dir / "config.json").read_text())["train"]["epochs"] == 5

    # The exported model is the trained one: it scores the reported accuracy on its own.
    from hvdtrain.config import presets
    from hvdtrain.data import sources
    model = exported_model(run_dir)
    evaluation = sources.load(presets.digits().data, seed=42).eval
    predicted = np.argmax(model.predict(evaluation.x, verbose=0), axis=1)
    assert np.mean(predicted == evaluation.y) == pytest.approx(summary["final_eval_accuracy"])

    # `hvdtrain eval` scores the latest checkpoint (epoch 5, the final weights) the same way, on
    # the ranks training had and on one process. Once, under mpirun: how eval gathers the ranks'
    # counts does not depend on the launcher.
    if launcher != "mpi":
        return
    for eval_launcher, ranks in [(launcher, 2), ("single", 1)]:
        scored = launch(eval_launcher, ranks, hvdtrain("eval", "--run-dir", str(run_dir)))
        assert_ok(scored, f"hvdtrain eval on {ranks} ranks")
        lines = [line for line in scored.output.splitlines() if '"eval_accuracy"' in line]
        assert len(lines) == 1, scored.output  # rank 0 alone
        result = json.loads(lines[0][lines[0].index("{"):])
        assert result["epoch"] == 5 and result["eval_samples"] == 360
        assert result["eval_accuracy"] == pytest.approx(summary["final_eval_accuracy"])


@pytest.mark.either_launcher
def test_stop_after_2_epochs_and_resume_to_4_equals_4_straight(launcher, four_straight_epochs,
                                                               tmp_path):
    resumed = tmp_path / "resumed"
    assert_ok(launch(launcher, 2, hvdtrain("train", *RESUME_ARGS, "--epochs", "2",
                                           "--run-dir", str(resumed))), "2 epochs")
    job = launch(launcher, 2, hvdtrain("train", *RESUME_ARGS, "--epochs", "4", "--resume",
                                       "--run-dir", str(resumed)))
    assert_same_as_straight(job, resumed, four_straight_epochs)
    # The run's first config stays as it was; the resume's own is recorded beside it.
    assert json.loads((resumed / "config.json").read_text())["train"]["epochs"] == 2
    assert json.loads((resumed / "config.resume-0002.json").read_text())["train"]["epochs"] == 4


def assert_same_as_straight(job, resumed: Path, straight: Path) -> None:
    """A resume to 4 epochs ended as the 4 straight ones: same weights, epochs 3 and 4 run."""
    assert_ok(job, "resume to 4")
    a = exported_model(straight).get_weights()
    b = exported_model(resumed).get_weights()
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6, err_msg="weights")
    assert "resuming" in job.output and "after epoch 2" in job.output
    assert re.findall(r"epoch (\d)/4 +loss", job.output) == ["3", "4"]
    lines = (resumed / "metrics.jsonl").read_text().splitlines()
    epochs = [json.loads(line)["epoch"] for line in lines]
    assert epochs == [1, 2, 3, 4]


# Wrong resumes, made in the ranks by a wrapper around hvdtrain's CLI: one that restores the
# checkpoint but starts over at epoch 0 and says nothing, and one that restores the weights but
# leaves the optimizer's state fresh (the momentum and the step count at zero; its learning
# rate is set by the schedule anyway).
WRONG_RESUME = """
import sys
import tensorflow as tf
from hvdtrain import cli
from hvdtrain.training import checkpoints, rundir
restore, opened = checkpoints.restore, rundir.open_run_dir


def restore_without_the_optimizer_state(checkpoint, path):
    restore(checkpoint, path)
    for v in checkpoint.optimizer.variables:
        if "learning_rate" not in v.name:
            v.assign(tf.zeros_like(v))


if sys.argv[1] == "epoch-0":
    rundir.open_run_dir = lambda *a, **k: (0, opened(*a, **k)[1])
else:
    checkpoints.restore = restore_without_the_optimizer_state
sys.argv[1:2] = []
cli.main()
"""


@pytest.mark.beside   # no bound on time: off the critical path
@pytest.mark.one_stack   # a control: run once, on the main stack
@pytest.mark.parametrize("wrong", ["epoch-0", "no-optimizer-state"])
def test_control_a_wrong_resume_is_caught(wrong, two_epochs, four_straight_epochs, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(two_epochs, resumed)
    wrapper = tmp_path / "wrong_resume.py"
    wrapper.write_text(WRONG_RESUME)
    job = launch("mpi", 2, [sys.executable, str(wrapper), wrong, "train", *RESUME_ARGS,
                            "--epochs", "4", "--resume", "--run-dir", str(resumed)])
    with pytest.raises(AssertionError, match="weights"):   # it ends elsewhere, and says so
        assert_same_as_straight(job, resumed, four_straight_epochs)


# ---------------------------------------------------------------------------------------------
# Bad input: every rank stops within seconds, one line from rank 0, exit status 2, no
# traceback from any rank, and an existing run directory is left exactly as it was.

def _bad_files(root: Path) -> Path:
    """The folder of the cases' files: a TFRecord file cut short."""
    root.mkdir(parents=True, exist_ok=True)
    truncated = root / "truncated.tfrecord"
    write_records(truncated, range(8), shape=(8, 8, 1))
    truncated.write_bytes(truncated.read_bytes()[:-20])  # a copy cut short
    return root


# What a launch adds to the loaders' own tests of each message (test_data_sources.py,
# test_images.py, test_predict.py, through the same sources.load): every rank stopping with one
# line, nothing written, for each way the ranks stop (below), and what depends on the launch
# itself (the world size, the config read on every rank, TensorFlow's own reader).
BAD_INPUT = {
    "missing file": (["--data", "npz", "--set", "data.path={root}/missing.npz"],
                     "does not exist"),
    "truncated TFRecord": (["--data", "tfrecord", "--set", "data.path={root}/truncated.tfrecord",
                            "--set", "data.eval_path={root}/truncated.tfrecord",
                            "--model", "mlp"], "truncated record at"),
    "more ranks than samples": (["--preset", "synthetic-mlp", "--set", "data.num_samples=2",
                                 "--set", "data.eval_fraction=0.5"], "1 samples but 2 ranks"),
    "unknown model": (["--model", "resnet51"], "unknown model 'resnet51'"),
    "run dir in use": (["--epochs", "1"], "already holds a run"),
    # Refused while reading the command line, before Horovod starts.
    "batch size 0": (["--batch-size", "0"], "train.batch_size must be > 0"),
    "negative lr": (["--lr", "-0.1"], "optim.lr must be > 0"),
    "unknown preset": (["--preset", "imagenet"], "unknown preset 'imagenet'"),
    "unknown key": (["--set", "train.epoch=3"], "did you mean 'train.epochs'"),
}
# Under both launchers, one case per way the ranks stop after Horovod starts: every rank finds
# the problem in its data, every rank in building the model, rank 0 alone in the run directory.
# Every other case (those before Horovod included) takes one launcher, in turn.
WAYS_TO_STOP = ["missing file", "unknown model", "run dir in use"]
# On the other stack (make test's beside lane) TensorFlow's own reader, whose version differs
# between the stacks: every other case differs in a check of numpy or of the config, and the
# ways to stop in how hvdtrain gathers the ranks' verdicts, which the stacks share (as they
# share test_an_error_on_one_rank_only_stops_every_rank's).
ON_BOTH_STACKS = {"truncated TFRecord"}
BAD_INPUT_RUNS = [
    pytest.param(case, launcher, marks=[] if case in ON_BOTH_STACKS else [pytest.mark.one_stack])
    for case, launcher in launcher_turns(list(BAD_INPUT), under_both=WAYS_TO_STOP)]


@pytest.mark.fault
@pytest.mark.parametrize("case, launcher", BAD_INPUT_RUNS)
def test_bad_input_stops_every_rank_with_one_line(case, launcher, tmp_path):
    root = _bad_files(tmp_path / "data")
    run_dir = tmp_path / "earlier-run"   # a finished run that must survive untouched
    (run_dir / "checkpoints/epoch-0002").mkdir(parents=True)
    (run_dir / "checkpoints/epoch-0002/meta.json").write_text('{"epochs_done": 2}')
    (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\n{"epoch": 2}\n')
    before = snapshot(run_dir)

    args, expected = BAD_INPUT[case]
    args = [a.format(root=root) for a in args]
    job = launch(launcher, 2, hvdtrain("train", *args, "--run-dir", str(run_dir)), timeout=120)
    assert_stopped_with_one_line(job, launcher, expected)
    assert snapshot(run_dir) == before


RANK_ONE_FAILS = """
import tensorflow as tf
from hvdtrain.launch import placement

def build(input_shape, num_classes):
    if placement.launcher_rank() == 1:  # e.g. a file or library missing on one host only
        raise ValueError("this host lacks something")
    inputs = tf.keras.Input(input_shape)
    x = tf.keras.layers.Flatten()(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x))
"""


@pytest.mark.fault
@pytest.mark.smoke
@pytest.mark.one_stack   # hvdtrain gathers the ranks' verdicts alike on both stacks
def test_an_error_on_one_rank_only_stops_every_rank(launcher, tmp_path):
    # Without gathering every rank's verdict, rank 0 would wait forever in its first collective.
    (tmp_path / "rank_one_fails.py").write_text(RANK_ONE_FAILS)
    job = launch(launcher, 2, hvdtrain("train", "--model", "rank_one_fails:build",
                                       "--run-dir", str(tmp_path / "run")),
                 env=importable_from(tmp_path), timeout=120)
    assert_stopped_with_one_line(job, launcher, "this host lacks something (on rank 1)")
    assert not (tmp_path / "run").exists()  # nothing written
