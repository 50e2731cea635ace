"""Bad input met during training, under each launcher in turn: a diverging loss, a full or
read-only run directory, ranks started with different configs, a checkpoint of another model.
Each stops every rank with one line and a non-zero exit, the run directory intact."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from fault_jobs import QUICK
from helpers import BIN, assert_stopped_with_one_line, hvdtrain, launch, snapshot
from hvdtrain.launch import launchers
from hvdtrain.training import checkpoints

pytestmark = [pytest.mark.multirank, pytest.mark.fault, pytest.mark.beside]


def resume_that_fails(launcher: str, trained: Path, run_dir: Path, expected: str,
                      *resume_args: str):
    """Resumes a copy of ``trained`` with ``resume_args``, which must stop with a line holding
    ``expected``; returns (that line, the run dir's files before, after)."""
    shutil.copytree(trained, run_dir)
    before = snapshot(run_dir)
    job = launch(launcher, 2, hvdtrain("train", *QUICK, "--resume", *resume_args,
                                       "--run-dir", str(run_dir)))
    return assert_stopped_with_one_line(job, launcher, expected), before, snapshot(run_dir)


@pytest.mark.either_launcher
def test_a_diverging_loss_stops_and_keeps_the_last_good_checkpoint(launcher, two_epochs,
                                                                   tmp_path):
    error, before, after = resume_that_fails(launcher, two_epochs, tmp_path / "run",
                                             "training diverged", "--epochs", "4",
                                             "--lr", "1e6")
    assert re.search(r"training diverged: the loss is (nan|inf) in epoch 3", error), error
    assert "epoch-0002" in error
    # No checkpoint and no metrics of the bad epoch; the resume's config is recorded beside
    # the run's own, which is kept.
    resumed_config = after.pop("config.resume-0002.json")
    assert after == before
    config = json.loads((tmp_path / "run" / "config.resume-0002.json").read_text())
    assert config["optim"]["lr"] == 1e6 and resumed_config != before["config.json"]


@pytest.mark.either_launcher
def test_a_full_run_dir_stops_every_rank_and_keeps_the_checkpoints(launcher, small_disk):
    # 200 KiB: the config and the first checkpoints fit, the disk fills a few epochs later.
    disk = small_disk("200k")
    run_dir = disk / "run"
    job = launch(launcher, 2, hvdtrain("train", *QUICK, "--epochs", "20",
                                       "--set", "run.keep_checkpoints=20",
                                       "--run-dir", str(run_dir)))
    error = assert_stopped_with_one_line(job, launcher, "cannot write checkpoint")
    assert "No space left on device" in error, error
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names and all(n.startswith("epoch-") for n in names)  # no half-written one
    assert checkpoints.latest(run_dir)[0] == len(names)


@pytest.mark.either_launcher
def test_a_read_only_run_dir_is_refused_before_training(launcher, small_disk):
    disk = small_disk("1m", "ro")
    job = launch(launcher, 2, hvdtrain("train", *QUICK, "--run-dir", str(disk / "run")))
    assert_stopped_with_one_line(
        job, launcher, f"cannot create run dir {disk / 'run'}: Read-only file system")


@pytest.mark.either_launcher
def test_ranks_started_with_different_configs_are_stopped(launcher, tmp_path):
    # A config file that differs between hosts, played here by each rank's own lr.
    rank = f"${launchers.entry(launcher).rank_variable}"
    command = f"exec {BIN / 'hvdtrain'} train {' '.join(QUICK)} --lr 0.0$((1 + {rank})) " \
              f"--run-dir {tmp_path / 'run'}"
    job = launch(launcher, 2, ["bash", "-c", command])
    error = assert_stopped_with_one_line(job, launcher, "(on rank 1)")
    assert re.search(r"the config differs from rank 0's \(hash \w+ vs \w+, in optim\.lr\)", error)
    assert not (tmp_path / "run").exists()


@pytest.mark.either_launcher
def test_a_checkpoint_of_another_model_is_refused(launcher, two_epochs, tmp_path):
    _, before, after = resume_that_fails(launcher, two_epochs, tmp_path / "run",
                                         "does not fit this model and optimizer",
                                         "--model", "cnn", "--epochs", "3")
    assert after == before
