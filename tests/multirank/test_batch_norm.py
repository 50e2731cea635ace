"""BatchNormalization across ranks: the moving statistics the same on every rank (a library
user's ``fit`` with ``dist.fit_callbacks()``, and the CLI's eval, checkpoint and export), and
synchronized batch normalization at 2 ranks x B equal to 1 rank x 2B. The library cases run in
one job of tests/batch_norm_worker.py per world size."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import (TESTS, assert_ok, exported_model, hvdtrain, importable_from,
                     largest_difference, launch, weights)
from stack import keras3

pytestmark = [pytest.mark.multirank, pytest.mark.core]

WORKER = TESTS / "batch_norm_worker.py"


def run_cases(launcher: str, ranks: int, batch: int, out: Path) -> tuple[list[dict], dict]:
    """Every rank's statistics cases, and each replay case's arrays per rank."""
    out.mkdir()
    job = launch(launcher, ranks, [sys.executable, str(WORKER), "--out", str(out),
                                   "--batch", str(batch)], timeout=240)
    assert_ok(job, f"the batch normalization cases at {ranks} ranks")
    statistics = [json.loads((out / f"statistics.rank{r}.json").read_text())
                  for r in range(ranks)]
    cases = {case: [weights(out / f"{case}.rank{r}.npz") for r in range(ranks)]
             for case in ("sync", "swapped", "plain")}
    return statistics, cases


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[list[dict], dict]:
    return run_cases("mpi", 2, 8, tmp_path_factory.mktemp("batch_norm") / "two")


def arrays(values: list) -> list[np.ndarray]:
    return [np.asarray(value) for value in values]


def test_moving_statistics_are_the_same_on_every_rank_after_each_epoch(two_ranks):
    (rank0, rank1), _ = two_ranks
    averaged, control = rank0["statistics"], rank0["statistics_control"]
    # The nested model's one BatchNormalization: its moving mean and variance (not the
    # Dropout's seed state, not the optimizer's), each rank's data with its own mean.
    assert len(averaged["end"]) == 2
    for moment in ("epoch0", "epoch1", "end"):
        assert largest_difference(arrays(averaged[moment]),
                                  arrays(rank1["statistics"][moment])) == 0, moment
    # fit's validation_data is scored with those statistics on every rank alike.
    assert rank0["statistics"]["validation"] == rank1["statistics"]["validation"]
    # Control: without the average each rank keeps its own.
    apart = largest_difference(arrays(control["end"]), arrays(rank1["statistics_control"]["end"]))
    print(f"moving statistics of ranks 0 and 1: {apart:.3g} apart without the average, "
          f"0 with it; rank 0's moving mean {np.round(control['end'][0][:3], 4)} vs rank 1's "
          f"{np.round(rank1['statistics_control']['end'][0][:3], 4)}")
    assert apart > 1e-2
    assert abs(control["validation"][-1] - rank1["statistics_control"]["validation"][-1]) > 1e-4


def test_synchronized_batch_norm_at_two_ranks_equals_one_rank_at_twice_the_batch(
        two_ranks, tmp_path):
    _, two = two_ranks
    _, one = run_cases("single", 1, 16, tmp_path / "one")
    # At one rank the synchronized layer is the plain one, off the fused kernel: on Keras 2,
    # whose plain layer takes that kernel by itself, the moving variance then lacks the
    # kernel's Bessel correction (1e-4 here), as Keras 2's unfused layer's does.
    replay = one["sync"][0]
    assert largest_difference(one["swapped"][0], replay) < 1e-6
    if keras3():
        assert largest_difference(one["plain"][0], replay) < 1e-6
    # Weights and moving statistics (Keras lists them among the weights).
    for case in ("sync", "swapped"):
        rank0, rank1 = two[case]
        assert largest_difference(rank0, rank1) == 0, case
        close = largest_difference(rank0, replay)
        print(f"{case}: 2 x 8 vs 1 x 16: {close:.1e}")
        assert close < 1e-5, (case, close)
    # Control: plain batch normalization at 2 x 8 normalizes each rank's half on its own.
    far = largest_difference(two["plain"][0], one["plain"][0])
    print(f"plain: 2 x 8 vs 1 x 16: {far:.1e}")
    assert far > 1e-3, far


# The CLI with a user's Conv-BN-Dense model on the digits; its run scored again below.
CLI_TRAIN = ["train", "--preset", "digits", "--epochs", "2", "--model",
             "batch_norm_worker:conv_bn_dense", "--set", "run.tensorboard=false"]


def eval_loss_of_export(run_dir: Path) -> float:
    """The exported model's mean loss on the eval set, in this process."""
    import tensorflow as tf
    from hvdtrain.config import presets
    from hvdtrain.data import sources
    evaluation = sources.load(presets.digits().data, seed=42).eval
    logits = exported_model(run_dir).predict(evaluation.x, batch_size=256, verbose=0)
    losses = tf.keras.losses.sparse_categorical_crossentropy(evaluation.y, logits,
                                                             from_logits=True)
    return float(np.mean(np.asarray(losses, np.float64)))


def test_the_reported_eval_is_the_saved_models_on_any_number_of_ranks(tmp_path):
    run_dir = tmp_path / "run"
    job = launch("mpi", 2, hvdtrain(*CLI_TRAIN, "--run-dir", str(run_dir)),
                 env=importable_from(TESTS), timeout=240)
    assert_ok(job, "hvdtrain train with a Conv-BN-Dense user model")
    reported = json.loads((run_dir / "summary.json").read_text())["final_eval_loss"]
    scored = {}
    for launcher, ranks in [("mpi", 2), ("single", 1)]:
        done = launch(launcher, ranks, hvdtrain("eval", "--run-dir", str(run_dir)),
                      env=importable_from(TESTS), timeout=180)
        assert_ok(done, f"hvdtrain eval on {ranks} ranks")
        lines = [line for line in done.output.splitlines() if '"eval_loss"' in line]
        assert len(lines) == 1, done.output  # rank 0 alone
        scored[ranks] = json.loads(lines[0][lines[0].index("{"):])["eval_loss"]
    scored["export"] = eval_loss_of_export(run_dir)
    print(f"summary's eval loss {reported:.6f}; hvdtrain eval {scored}")
    for where, loss in scored.items():
        assert loss == pytest.approx(reported, abs=1e-5), where


def test_the_custom_loop_with_synchronized_batch_norm_reports_the_exports_eval(tmp_path):
    """``model.sync_batch_norm`` through the trainer's custom loop: it trains at 2 ranks, the
    banner says so, the layer's moments cross the wire (the timeline holds their all-reduce and
    its gradient's), and the summary's eval loss is the export's (Keras 2: Horovod's layer in a
    SavedModel, loaded back)."""
    run_dir, timeline = tmp_path / "run", tmp_path / "timeline.json"
    job = launch("mpi", 2, hvdtrain(*CLI_TRAIN, "--loop", "custom", "--set",
                                    "model.sync_batch_norm=true", "--timeline", str(timeline),
                                    "--run-dir", str(run_dir)),
                 env=importable_from(TESTS), timeout=240)
    assert_ok(job, "hvdtrain train --loop custom with model.sync_batch_norm")
    assert "parameters, synchronized batch norm" in job.output
    names = set(re.findall(r'"name": ?"([^"]+)"', timeline.read_text()))
    moments = [name for name in names if "batch_norm" in name.lower()
               and not name.startswith("DistributedGradientTape")]  # Keras 2: gamma's, beta's
    print(f"the timeline's batch norm all-reduces: {sorted(moments)}")
    # Keras 3: hvdtrain's names, by place; Keras 2: Horovod's, after the layer's tensors (the
    # gradient's all-reduce named after the gradient's tensor).
    assert len(moments) == 2 if not keras3() else sorted(moments) == [
        "hvdtrain_sync_batch_norm_0", "hvdtrain_sync_batch_norm_0_gradient"], moments
    reported = json.loads((run_dir / "summary.json").read_text())["final_eval_loss"]
    exported = eval_loss_of_export(run_dir)
    print(f"custom loop, synchronized: summary's eval loss {reported:.6f}, export's {exported:.6f}")
    assert exported == pytest.approx(reported, abs=1e-5)
