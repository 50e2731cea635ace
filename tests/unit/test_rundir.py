"""The run directory: when one may be opened (hvdtrain.training.rundir without MPI), the record of
the config a run started with and of each resume, the exported model; and, as one process through
the CLI, a resume with nothing left to train and an eval without a checkpoint."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from helpers import (assert_ok, error_lines, exported_model, hvdtrain, launch, snapshot)
from hvdtrain.models import registry
from hvdtrain.training import checkpoints, rundir
from hvdtrain.config import presets
from hvdtrain.config import to_dict
from hvdtrain.errors import UserError

CONFIG = presets.build_config("synthetic-mlp")


def state() -> tf.train.Checkpoint:
    return tf.train.Checkpoint(v=tf.Variable(np.zeros(3, np.float32)))


def open_dir(run_dir, *, resume: bool, config=CONFIG) -> tuple[int, list[str]]:
    said: list[str] = []
    start, _ = rundir.open_run_dir(run_dir, state(), config, resume=resume, say=said.append,
                                   class_names=["a", "b"])
    return start, said


def test_a_new_run_dir_gets_the_config_and_the_class_names(tmp_path):
    assert open_dir(tmp_path / "run", resume=False) == (0, [])
    assert json.loads((tmp_path / "run/config.json").read_text()) == to_dict(CONFIG)
    assert json.loads((tmp_path / "run/classes.json").read_text()) == {"class_names": ["a", "b"]}


def test_resume_on_an_empty_run_dir_starts_at_epoch_1(tmp_path):
    start, said = open_dir(tmp_path / "run", resume=True)
    assert start == 0 and said == [f"no checkpoint in {tmp_path / 'run'} yet: starting at epoch 1"]
    assert json.loads((tmp_path / "run/config.json").read_text()) == to_dict(CONFIG)


@pytest.mark.fault
def test_a_run_dir_with_a_checkpoint_or_a_summary_is_refused_without_resume(tmp_path):
    checkpoints.save(state(), tmp_path / "trained", 2, {}, keep=3)
    (tmp_path / "finished").mkdir()
    (tmp_path / "finished/summary.json").write_text("{}")
    for name, message in (("trained", "already holds a run (checkpoint after epoch 2): pass "
                                      "--resume"),
                          ("finished", "already holds a finished run: choose another")):
        before = snapshot(tmp_path / name)
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            open_dir(tmp_path / name, resume=False)
        assert snapshot(tmp_path / name) == before   # nothing written


@pytest.mark.fault
def test_a_run_dir_that_exists_but_is_not_writable_is_refused(tmp_path, small_disk):
    if os.geteuid() == 0:   # root writes through permissions: a read-only file system
        disk = small_disk("1m")
        (disk / "run").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, timeout=30)
        run_dir = disk / "run"
    else:
        run_dir = tmp_path / "run"
        run_dir.mkdir(mode=0o555)
    with pytest.raises(UserError, match=f"run dir {run_dir} is not writable: choose another"):
        open_dir(run_dir, resume=False)
    assert not any(run_dir.iterdir())


def test_a_resume_keeps_the_first_config_and_records_its_own_beside_it(tmp_path):
    run_dir = tmp_path / "run"
    open_dir(run_dir, resume=False)
    checkpoints.save(state(), run_dir, 3, {"metrics": {"loss": 0.5}}, keep=3)
    longer = presets.build_config("synthetic-mlp", assignments=["train.epochs=9"])
    start, said = open_dir(run_dir, resume=True, config=longer)
    assert start == 3 and said == [f"resuming {run_dir} after epoch 3 from epoch-0003"]
    assert json.loads((run_dir / "config.json").read_text()) == to_dict(CONFIG)  # as it started
    resumed = json.loads((run_dir / "config.resume-0003.json").read_text())
    assert resumed == to_dict(longer) and resumed["train"]["epochs"] == 9


def test_the_embedding_model_exports_and_loads_back(tmp_path):
    # Its Lambda layer (inputs to token ids) must survive the export.
    cfg = presets.build_config("digits", assignments=["model.name=embedding"])
    model = registry.build(cfg.model, (8, 8, 1), 10)
    inputs = np.random.default_rng(0).random((16, 8, 8, 1), dtype=np.float32)
    rundir.export(model, tmp_path, class_names=[str(c) for c in range(10)])
    loaded = exported_model(tmp_path)
    np.testing.assert_allclose(loaded.predict(inputs, verbose=0), model.predict(inputs, verbose=0),
                               rtol=0, atol=1e-6)
    assert json.loads((tmp_path / "model/classes.json").read_text())["class_names"][9] == "9"


# ---------------------------------------------------------------------------------------------
# Through the CLI, one process (Horovod alone): the run directory's other answers.

ONE_EPOCH = ["--preset", "synthetic-mlp", "--epochs", "1", "--set", "run.tensorboard=false",
             "--set", "run.export=false"]


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("one-epoch") / "run"
    assert_ok(launch("single", 1, hvdtrain("train", *ONE_EPOCH, "--run-dir", str(run_dir))),
              "1 epoch")
    return run_dir


@pytest.mark.multirank
def test_a_resume_with_nothing_left_to_train_says_so_and_trains_nothing(one_epoch_run):
    checkpointed = snapshot(one_epoch_run / "checkpoints")
    job = launch("single", 1, hvdtrain("train", *ONE_EPOCH, "--resume",
                                       "--run-dir", str(one_epoch_run)))
    assert_ok(job, "resume")
    assert f"nothing to train: {one_epoch_run} is at epoch 1 of 1; raise train.epochs" \
        in job.output, job.output
    assert not error_lines(job.output) and "epoch 1/1" not in job.output
    assert snapshot(one_epoch_run / "checkpoints") == checkpointed
    assert len((one_epoch_run / "metrics.jsonl").read_text().splitlines()) == 1
    assert (one_epoch_run / "config.resume-0001.json").exists()


@pytest.mark.multirank
@pytest.mark.fault
def test_eval_without_a_checkpoint_is_refused_with_one_line(one_epoch_run, tmp_path):
    untrained = tmp_path / "untrained"
    untrained.mkdir()
    (untrained / "config.json").write_text((one_epoch_run / "config.json").read_text())
    job = launch("single", 1, hvdtrain("eval", "--run-dir", str(untrained)))
    assert job.returncode == 2 and not job.leftovers, job.output
    assert error_lines(job.output) == [f"hvdtrain: error: {untrained} holds no checkpoint to "
                                       f"evaluate"], job.output
    assert "Traceback" not in job.output
