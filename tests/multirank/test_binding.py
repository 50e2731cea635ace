"""The Keras binding through a library user's own ``fit`` (tests/binding_worker.py runs the
cases in one job): sparse gradients after dense ones, a model without an Input, Adam's state
restored on rank 0 only, the binding's refusals on every rank; and at one rank, the reducer's
pass-through."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import (EXACT, TESTS, assert_ok, assert_same_training, hvdtrain, importable_from,
                     largest_difference, launch, weights)
from stack import keras3

WORKER = TESTS / "binding_worker.py"
# horovod.bucket_mb's cases (both stacks: bucket_model at bucket_mb 0, 0.00001 and 0.0005), and
# for each, the Horovod ops of a traced step with the gradients each one waits for (variable
# positions; backprop makes 5 first, 0 last): one grouped all-reduce per bucket, the last
# layers' first, none waiting for a gradient of another bucket.
BUCKETS = {"buckets_none": [[0, 1, 2, 3, 4, 5]],
           "buckets_each": [[5], [4], [3], [2], [1], [0]],
           "buckets_some": [[3, 4, 5], [2], [0, 1]]}
# The cases of tests/binding_worker.py's user_step_cases that must equal 1 rank at 2B: own
# train_step (one optimizer, two), rank 0 building a model more first, state loaded on rank 0
# only, and on Keras 3 a loaded model.keras's optimizer made distributed.
USER_STEPS = ("own_step_1", "own_step_2", "extra_model_first", "loaded_on_rank0",
              *(("loaded_model",) if keras3() else ()))


def run_cases(np_: int, out: Path, *args: str) -> tuple[dict[str, list[list[np.ndarray]]],
                                                        list[dict]]:
    """Every case's arrays, per rank, and every rank's checks."""
    out.mkdir()
    job = launch("mpi", np_, [sys.executable, str(WORKER), "--out", str(out), *args],
                 timeout=240)
    assert_ok(job, f"the binding's cases at {np_} ranks")
    cases: dict[str, list[list[np.ndarray]]] = {}
    for path in sorted(out.glob("*.rank*.npz")):
        cases.setdefault(path.name.split(".")[0], []).append(weights(path))
    checks = [json.loads(path.read_text()) for path in sorted(out.glob("checks.rank*.json"))]
    return cases, checks


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[dict, list[dict]]:
    """The cases at 2 ranks x batch 8, run once for the tests below."""
    return run_cases(2, tmp_path_factory.mktemp("binding") / "two", "--batch", "8")


def assert_refused_or_kept(checks: dict) -> None:
    """One rank's refusals, and AdamW's exclude_from_weight_decay set before wrapping still
    holding: the bias left alone while the kernel decays (a copy rebuilt from the config, as
    the Keras 3 wrapper made before, decayed both)."""
    assert checks["weight_decay"] == {"bias": [1.0, 1.0], "kernel_decayed": True}
    # A tape's gradients given to a distributed optimizer: refused, not reduced twice.
    assert checks["double_reduction"].startswith("these gradients come from dist.distributed_tape")
    # Both stacks' optimizers and tapes reduce through the one reducer: buckets and Adasum
    # taken (Keras 2 refused both while Horovod's own optimizer and tape reduced).
    assert checks["bucket_mb_optimizer"] == checks["bucket_mb_tape"] == ""
    assert checks["adasum_in_fit"] == ""
    if not keras3():
        return
    # A train function traced before the optimizer was wrapped (fit, wrap, fit): refused.
    assert checks["wrapped_after_fit"].startswith("the model's train function was made before")
    # Keras 3's own gradient accumulation: taken, the all-reduce once per update (its
    # training: grad_accumulation_optimizer in docs/guarantees.md).
    assert checks["accumulation_steps"] == ""
    # unscale_gradients, a no-op on Keras 3 before (the loss scale optimizer unscales inside
    # apply_gradients): refused, saying what to use.
    assert checks["unscale"].startswith("unscale_gradients() does not exist on Keras 3")


@pytest.mark.multirank
@pytest.mark.core
def test_library_pattern_at_two_ranks_ends_with_identical_ranks(two_ranks):
    two, checks = two_ranks
    # Bug 1: a dense gradient before the embedding's sparse one trains; bug 2: a model without
    # an Input (seeds 100 + rank) ends alike on both ranks.
    for case in ("dense_first", "no_input", *USER_STEPS, *BUCKETS):
        assert largest_difference(*two[case]) == 0, case
    # horovod.bucket_mb: one all-reduce per bucket, each waiting only for its own gradients,
    # so the executor may start the last layers' while backprop goes on (control: at
    # bucket_mb 0 the one all-reduce waits for every gradient). A bucket of several gradients
    # goes as one flat tensor (HorovodAllreduce); one of a single gradient, grouped.
    for pair in checks:
        assert {case: [positions for kind, positions in pair["buckets"][case]]
                for case in BUCKETS} == BUCKETS
        for case, expected in BUCKETS.items():
            assert [kind for kind, _ in pair["buckets"][case]] == [
                "HorovodAllreduce" if len(positions) > 1 else "HorovodGroupedAllreduce"
                for positions in expected], case
    # Each rank draws its own dropout masks (Keras 3 broadcast rank 0's seed state with the
    # weights: the same mask for sample i on every rank), from identical weights.
    (masks0, *weights0), (masks1, *weights1) = two["dropout_masks"]
    assert largest_difference(weights0, weights1) == 0
    assert masks0.shape == (8, 32) and (masks0 != masks1).mean() > 0.2
    # Adam restored on rank 0 only: its step count (7, then 1 step) and slots reach rank 1.
    rank0, rank1 = two["restored"]
    assert largest_difference(rank0, rank1) == 0
    assert int(rank1[0]) == 7 + 1
    for pair in checks:
        assert_refused_or_kept(pair)
        # Float32 and float16 gradients in one step: each averaged, dtype kept (the ranks gave
        # different values, so a reduction that did nothing would fail here).
        assert pair["mixed"] == [1.5, 3.0] and pair["mixed_dtypes"] == ["float32", "float16"]
        # The same with horovod.bucket_mb, each gradient its own bucket: each back in its place.
        assert pair["mixed_buckets"] == [[1.5], [3.0], [4.5, 5.0], [6.0]]
        # Unequal batch counts (33 and 32 rows at batch 8) and XLA: one line on every rank.
        assert pair["unequal_steps"].startswith("the ranks would run different numbers of steps "
                                                "per epoch in fit (rank 0: 5, rank 1: 4)")
        assert pair["jit_compile"].startswith("this model is compiled with XLA")
        # A layer skipped on rank 1, at one all-reduce and in buckets of one gradient each or
        # several, and under Keras 3's accumulation; an Embedding skipped: every rank stops
        # with the line naming the variable (the ranks' all-reduces differ, and would wait for
        # Horovod's stall check).
        for said in pair["skipped_layer"]:
            assert re.match(r"variable '\S*dense\S*/kernel\S*' has a gradient on rank 0 but "
                            r"none on rank 1", said), pair["skipped_layer"]
        assert len(pair["skipped_layer"]) == (5 if keras3() else 4), pair["skipped_layer"]
        for said in pair["skipped_embedding"]:
            assert re.match(r"variable '\S*embedding\S*' has a gradient on rank 0 but none on "
                            r"rank 1", said), pair["skipped_embedding"]
        # A loop of one's own gets the reducer's error (no fit to turn it into the line).
        from hvdtrain.distributed.reducer import MISSING_ON_SOME_RANKS
        assert MISSING_ON_SOME_RANKS in pair["skipped_on_tape"], pair["skipped_on_tape"]
        # A step traced again on rank 0 alone (a batch of another size) still averages with
        # rank 1's: the reducer's check runs every step (Grappler folded it, once per trace,
        # into the first call: rank 0 then waited alone in its second trace's).
        assert pair["retraced_alone"] == [[3.0], [1.5]], pair["retraced_alone"]
    # Rank 1 had no batch and joined at once: rank 0's batch averaged with its zeros.
    assert checks[0]["joined"] == [2.0]
    assert checks[0]["last_to_join"] == checks[1]["last_to_join"] == 0


@pytest.mark.multirank
@pytest.mark.core
def test_library_pattern_at_two_ranks_equals_one_rank_at_twice_the_batch(two_ranks, tmp_path):
    # The model is broadcast with its optimizer before the first step, built by then or not,
    # on both stacks (Horovod's own Keras 2 callback broadcasts after it: no exact replay).
    two, checks = two_ranks
    one, (single,) = run_cases(1, tmp_path / "one", "--batch", "16")
    for case in ("dense_first", "no_input", *USER_STEPS, *BUCKETS):
        assert largest_difference(two[case][0], one[case][0]) < 1e-5, case
    # Every bucket size reduces to the same sums, bit for bit (a result put back at another
    # gradient's place, control run by hand, fails both checks).
    for case in BUCKETS:
        assert largest_difference(two[case][0], two["buckets_none"][0]) == 0, case
    # Controls for bug 2, the broadcasts of earlier versions: at on_train_begin only, when
    # nothing is built yet, or after the first step (as Horovod's Keras 2 callback), the ranks
    # agree (the distributed optimizer's first update takes rank 0's variables, else the first
    # of them would have parted ways), but their first step started from different weights.
    old, _ = run_cases(2, tmp_path / "old", "--batch", "8", "--old-broadcasts")
    for late in old.values():
        assert largest_difference(*late) == 0
        assert largest_difference(late[0], one["no_input"][0]) > 1e-3
    # At 1 rank (the replay's job): the gradients pass through untouched, with no all-reduce
    # (control: fp16 on the wire would round them; a traced all-reduce shows as a Horovod op).
    assert single["passed_through"] == [np.float32(3.14159265)]
    assert single["fp16_round_trip"] != single["passed_through"]
    assert single["reducer_ops"] == [] and single["allreduce_ops"] == ["HorovodAllreduce"]
    assert_refused_or_kept(single)
    if not keras3():
        return
    # Metric averaging: an array metric element-wise; metrics named differently on the ranks
    # (one each, so a count alone would not tell) stop both ranks with one line.
    for pair in checks:
        assert pair["averaged"] == {"loss": 1.5, "per_class": [1.0, 3.0]}
        assert pair["other_names"] == ("the ranks log different metrics, which cannot be "
                                       "averaged: rank 0 accuracy, rank 1 mae; compile the same "
                                       "metrics on every rank")


# The CLI's job, plain SGD with no scaling or warmup, so that 2 ranks x 16 replay 1 x 32.
CLI_JOB = ["train", "--preset", "synthetic-mlp", "--epochs", "2", *EXACT,
           "--model", "binding_worker:dense_first_on_input", "--set", "data.shuffle=false",
           "--set", "optim.lr_scaling=none", "--set", "optim.warmup_epochs=0"]


def cli_summary(tmp_path: Path, launcher: str, ranks: int, batch: int, *args: str) -> dict:
    run_dir = tmp_path / f"{ranks}x{batch}"
    job = launch(launcher, ranks, hvdtrain(*CLI_JOB, "--batch-size", str(batch),
                                           "--run-dir", str(run_dir), *args),
                 env=importable_from(TESTS), timeout=180)
    assert_ok(job, f"hvdtrain train with the dense-first user model, {ranks} x {batch}")
    assert "model binding_worker:dense_first_on_input, 1,232 parameters" in job.output
    if args:  # Keras 3's buckets, named on the banner's horovod line
        assert re.search(r"  horovod fusion .*, buckets 0.0001 MB$", job.output, re.M), job.output
        # Under mpirun the banner notes buckets that wait for backprop: one thread per rank.
        threads = re.search(r"x (\d+) threads per rank", job.output)
        assert threads, job.output
        noted = "  note  buckets under mpirun with one core per rank" in job.output
        assert noted == (launcher == "mpi" and threads[1] == "1"), job.output
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.multirank
@pytest.mark.core
def test_cli_trains_a_user_model_whose_dense_gradients_come_first(tmp_path):
    # Before the reducer grouped sparse gradients apart, both ranks failed here with
    # "'SymbolicTensor' object has no attribute 'dense_shape'".
    # On Keras 3 in two buckets (the dense kernel's 208 bytes, then its bias's 16, beside the
    # embedding's sparse gradient): the same result.
    two = cli_summary(tmp_path, "mpi", 2, 16,
                      *(("--set", "horovod.bucket_mb=0.0001") if keras3() else ()))
    one = cli_summary(tmp_path, "single", 1, 32)
    assert_same_training({**two, "world_size": 1}, one)
    # Control: one rank at half the batch (what a rank alone would do) ends elsewhere.
    half = cli_summary(tmp_path, "single", 1, 16)
    assert abs(half["final_train_loss"] - one["final_train_loss"]) > 1e-3


def test_backward_passes_given_to_the_fit_path_are_refused_with_one_line():
    import tensorflow as tf
    from hvdtrain import distributed as dist
    from hvdtrain.config import HorovodConfig
    from hvdtrain.errors import UserError
    with pytest.raises(UserError, match=r"^backward_passes_per_step > 1 is not applied .* "
                                        r"accumulate in hvdtrain's custom loop \(--loop custom\)$"):
        dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1),
                                   HorovodConfig(backward_passes_per_step=2))
    # Control: k = 1 is the plain optimizer's path, accepted.
    assert dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1),
                                      HorovodConfig(backward_passes_per_step=1))
