"""Documented options run end to end through the CLI, each asserting its effect: a TOML file
(`train --config`) choosing Adam, sqrt LR scaling and the cosine decay at 2 ranks, Adam at 2
ranks against one rank at twice the batch, and `run.device=gpu` refused where there is none."""
from __future__ import annotations

import json
import math
import re
import subprocess

import pytest

from conftest import assert_ok, hvdtrain, launch, launcher_env

BASE_LR = 0.001
CONFIG = f"""
[optim]
name = "adam"
lr = {BASE_LR}
lr_scaling = "sqrt"
warmup_epochs = 0
decay = "cosine"

[train]
epochs = 3

[run]
tensorboard = false
"""


@pytest.mark.multirank
def test_a_config_file_sets_adam_sqrt_scaling_and_the_cosine_decay(tmp_path):
    config, run_dir = tmp_path / "config.toml", tmp_path / "run"
    config.write_text(CONFIG)
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


def test_run_device_gpu_is_refused_with_one_line_where_there_is_no_gpu(tmp_path):
    done = subprocess.run(hvdtrain("train", "--preset", "digits-mlp", "--set", "run.device=gpu",
                                   "--run-dir", str(tmp_path / "run")), env=launcher_env(),
                          capture_output=True, text=True, timeout=120)
    line = "hvdtrain: error: run.device=gpu but TensorFlow sees no GPU here"
    assert done.returncode == 2 and done.stderr.count(line) == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()
