"""The consistency check's comparisons, on plain values as every rank's snapshots hold them
(distributed/divergence.py), and the MinHash signature of the samples an epoch trained on
(distributed/batch_record.py) computed for two made-up ranks: each with a control that shows
the check is sharp. The check across real ranks: the guarantees job's control_divergence_*
cases (tests/multirank/test_guarantees.py)."""
from __future__ import annotations

import numpy as np
import pytest

from hvdtrain.distributed import divergence
from hvdtrain.distributed.divergence import Snapshot

pytestmark = pytest.mark.one_stack   # pure values; the TensorFlow ops are the same on both


def snaps(*checksums, phase=("epoch end", 0), hyper=None):
    return [Snapshot(phase, ("dense/kernel", "dense/bias"), np.asarray(c, np.float64),
                     dict(hyper or {})) for c in checksums]


def test_equal_checksums_agree_and_one_changed_variable_is_named_with_its_rank():
    same = [[1.5, 3.0], [-0.25, 0.5]]
    assert divergence.difference_problem(snaps(same, same, same), "after epoch 1") is None
    moved = [[1.5, 3.0], [-0.25 + 1e-3, 0.5]]
    problem = divergence.difference_problem(snaps(same, same, moved), "after epoch 1")
    assert "variable 'dense/bias' (1 of 2 differ)" in problem and "on rank 2" in problem
    assert divergence.variable_difference(snaps(same, moved)) == (1, 1, 1)


def test_a_difference_within_rounding_of_a_large_sum_is_not_drift():
    big = [[1e6, 1e12], [0.0, 1.0]]
    rounded = [[1e6 * (1 + 1e-9), 1e12], [0.0, 1.0]]
    assert divergence.variable_difference(snaps(big, rounded)) is None
    drifted = [[1e6 * (1 + 1e-4), 1e12], [0.0, 1.0]]
    assert divergence.variable_difference(snaps(big, drifted)) == (1, 0, 1)


def test_a_hyperparameter_that_differs_is_named_before_any_variable():
    same = [[1.0, 1.0], [1.0, 1.0]]
    ranks = snaps(same, same, hyper={"learning_rate": 0.1, "momentum": 0.9})
    assert divergence.difference_problem(ranks, "now") is None
    lowered = ranks[:1] + [Snapshot(ranks[1].phase, ranks[1].names, ranks[1].checksums,
                                    {"learning_rate": 0.01, "momentum": 0.9})]
    problem = divergence.difference_problem(lowered, "after epoch 2")
    assert problem.startswith("the ranks' optimizers differ after epoch 2: learning_rate is "
                              "0.1 on rank 0 but 0.01 on rank 1")
    assert divergence.differing_hyperparameters(lowered) == {"learning_rate"}


def test_ranks_at_different_points_are_named_each_with_its_point():
    assert divergence.phase_problem(snaps([], [], phase=("epoch", 2))) is None
    restored = [Snapshot(("epoch", 3)), Snapshot(("epoch", 0))]
    assert "rank 0 starting epoch 4, rank 1 starting epoch 1" in divergence.phase_problem(
        restored)
    stopped = [Snapshot(("end",)), Snapshot(("epoch", 2))]
    problem = divergence.phase_problem(stopped)
    assert "rank 0 at the end of training, rank 1 starting epoch 3" in problem
    assert "stopped training on some ranks only" in problem


def test_validation_on_some_ranks_only_is_named():
    assert divergence.phase_problem([Snapshot(("validation", 0))] * 2) is None
    problem = divergence.phase_problem([Snapshot(("validation", 0)), Snapshot(("epoch end", 0))])
    assert problem.startswith("the ranks do not all validate (rank 0 validating in epoch 1, "
                              "rank 1 ending epoch 1)")


def test_identical_first_batches_are_caught_and_different_ones_pass():
    assert divergence.same_batches([(10.0, 50.0, 64.0), (10.0, 50.0, 64.0)])
    assert not divergence.same_batches([(10.0, 50.0, 64.0), (10.5, 50.0, 64.0)])
    assert not divergence.same_batches([(0.0, 0.0, 0.0), (0.0, 0.0, 0.0)])  # no numbers seen


def signature(tf, rows: np.ndarray, batch: int = 16) -> tuple[int, ...]:
    """What a rank's first epoch records: the least hash of each function over its batches."""
    from hvdtrain.distributed.batch_record import HASHES, sample_hashes
    least = np.full(HASHES, divergence.NO_SAMPLE, np.int64)
    for start in range(0, len(rows), batch):
        batch_rows = tf.constant(rows[start:start + batch])
        hashes = sample_hashes((batch_rows, tf.zeros([len(batch_rows)], tf.int64))).numpy()
        least = np.minimum(least, hashes.min(axis=0))
    return tuple(int(x) for x in least)


def test_ranks_that_train_the_same_samples_in_another_order_are_caught_and_shards_pass():
    import tensorflow as tf
    x = np.random.default_rng(3).normal(size=(512, 8, 8, 1)).astype("float32")
    order = np.random.default_rng(4).permutation(len(x))
    whole = [Snapshot(("epoch end", 0), samples=signature(tf, x)),
             Snapshot(("epoch end", 0), samples=signature(tf, x[order]))]
    rank, share = divergence.repeated_samples(whole)
    assert rank == 1 and share == 1.0
    assert "trained on mostly the same samples" in divergence.repeated_problem(whole)
    shards = [Snapshot(("epoch end", 0), samples=signature(tf, x[r::2])) for r in range(2)]
    assert divergence.repeated_samples(shards) is None
    # Half the rows in common is below the line; three quarters is above it.
    assert divergence.repeated_samples(
        [Snapshot(("e",), samples=signature(tf, x[:256])),
         Snapshot(("e",), samples=signature(tf, x[128:384]))]) is None
    assert divergence.repeated_samples(
        [Snapshot(("e",), samples=signature(tf, x[:448])),
         Snapshot(("e",), samples=signature(tf, x[64:]))]) is not None
