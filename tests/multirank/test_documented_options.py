"""Documented options run end to end through the CLI, each asserting its effect: a TOML file
(`train --config`) choosing Adam, sqrt LR scaling and the cosine decay at 2 ranks, `eval --set`
and `predict --batch-size` on that run, each bundled model for one step, and `run.device=gpu`
refused where there is none."""
from __future__ import annotations

import json
import math
import re
import csv
import subprocess

import numpy as np

import pytest

from helpers import assert_ok, hvdtrain, launch, launcher_env

BASE_LR = 0.001
CONFIG = """
[optim]
name = "adam"
lr = {lr}
lr_scaling = "sqrt"
warmup_epochs = 0
decay = "cosine"

[train]
epochs = 3

[data]
source = "npz"
path = "{path}"

[run]
tensorboard = false
"""


def npz(path, n: int, seed: int):
    rng = np.random.RandomState(seed)
    np.savez(path, x=rng.rand(n, 8, 8, 1).astype("float32"), y=rng.randint(0, 3, n))
    return path


@pytest.mark.multirank
def test_a_config_file_sets_adam_sqrt_scaling_and_the_cosine_decay(tmp_path):
    config, run_dir = tmp_path / "config.toml", tmp_path / "run"
    config.write_text(CONFIG.format(path=npz(tmp_path / "train.npz", 400, 0), lr=BASE_LR))
    job = launch("mpi", 2, hvdtrain("train", "--preset", "digits-mlp", "--config", str(config),
                                    "--run-dir", str(run_dir)))
    assert_ok(job, "train --config")
    saved = json.loads((run_dir / "config.json").read_text())["optim"]
    assert (saved["name"], saved["lr_scaling"], saved["decay"]) == ("adam", "sqrt", "cosine")
    steps = int(re.search(r"(\d+) steps per epoch", job.output).group(1))
    peak, total = BASE_LR * math.sqrt(2), 3 * steps
    # metrics.jsonl's lr is the one of each epoch's last step: cosine from the peak to 0.
    expected = [0.5 * peak * (1 + math.cos(math.pi * (e * steps - 1) / total))
                for e in (1, 2, 3)]
    lrs = [json.loads(line)["lr"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx(expected, rel=1e-5), (lrs, expected)
    # Sharp: linear scaling, or no decay, gives another trace.
    assert lrs != pytest.approx([e / math.sqrt(2) * 2 for e in expected], rel=1e-3)
    assert lrs != pytest.approx([peak] * 3, rel=1e-3)
    # The same run evaluated at 2 ranks on another eval set (`eval --set`), and predicted at
    # 2 ranks in batches of 7 (`predict --batch-size`): every one of its 50 samples, in order.
    other = npz(tmp_path / "other.npz", 50, 1)
    job = launch("mpi", 2, hvdtrain("eval", "--run-dir", str(run_dir),
                                    "--set", f"data.eval_path={other}"))
    assert_ok(job, "eval --set")
    assert '"eval_samples": 50}' in job.output and '"eval_samples": 80}' not in job.output
    table = tmp_path / "predicted.csv"
    job = launch("mpi", 2, hvdtrain("predict", "--run-dir", str(run_dir), "--batch-size", "7",
                                    str(other), "--out", str(table)))
    assert_ok(job, "predict --batch-size")
    with table.open() as f:
        assert [row["input"] for row in csv.DictReader(f)] == [str(i) for i in range(50)]
    # The batches took effect: rank 0's 25 inputs in 4 batches of up to 7 (the default, 256:
    # one batch of 25).
    assert "(rank 0: 4 batches, the largest of 7)" in job.output, job.output[-2000:]


def test_run_device_gpu_is_refused_with_one_line_where_there_is_no_gpu(tmp_path):
    # Where TensorFlow sees a GPU (this process's, the ranks' own), the same run is accepted
    # and trains on it: the test holds on either machine, with no skip.
    import tensorflow as tf
    gpu = bool(tf.config.list_physical_devices("GPU"))
    done = subprocess.run(hvdtrain("train", "--preset", "digits-mlp", "--set", "run.device=gpu",
                                   "--epochs", "1", "--run-dir", str(tmp_path / "run")),
                          env=launcher_env(), capture_output=True, text=True, timeout=120)
    line = "hvdtrain: error: run.device=gpu but TensorFlow sees no GPU here"
    if gpu:
        assert done.returncode == 0 and line not in done.stderr, done.stderr[-2000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["device"] == "/GPU:0", summary
    else:
        assert done.returncode == 2 and done.stderr.count(line) == 1, done.stderr[-2000:]
        assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


@pytest.mark.multirank
@pytest.mark.beside   # no bound on time: off the critical path
# ResNet-50 on one process: what 2 ranks add (rank 0's state broadcast, the gradients reduced,
# BatchNormalization's statistics, the consistency check over every variable) is the same
# work on the two convolutional models with BatchNormalization before it, and ResNet-50's
# 2-rank step was the beside lane's longest test (benchmarks/results/test_lanes.md).
@pytest.mark.parametrize("model, ranks", [("resnet_small", 2), ("mobilenetv2", 2),
                                          ("resnet50", 1)])
def test_each_bundled_model_trains_one_step(model, ranks, tmp_path):
    # 80 synthetic 32x32 images: 64 to train, one step of 32 per rank (two at 1 rank); 16
    # held out.
    run_dir = tmp_path / "run"
    job = launch("mpi" if ranks > 1 else "single", ranks,
                 hvdtrain("train", "--preset", "synthetic-mlp", "--epochs", "1",
                          "--set", f"model.name={model}", "--set", "data.image_shape=32,32,3",
                          "--set", "data.num_samples=80", "--set", "run.export=false",
                          "--set", "run.tensorboard=false", "--run-dir", str(run_dir)),
                 timeout=300)
    assert_ok(job, f"{model} at {ranks} ranks")
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = 2 // ranks
    assert re.search(rf"\b{steps} steps? per epoch", job.output), job.output[-2000:]
    assert summary["world_size"] == ranks and math.isfinite(summary["final_train_loss"]), \
        summary
    assert f"model {model}," in job.output
