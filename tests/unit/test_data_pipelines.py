"""hvdtrain.data.sources' per-rank pipelines of arrays without MPI, for any (rank, size): each
rank's train epochs equal in steps, complete and disjoint across ranks, resumed at any epoch
to the same batches, in shard order without a shuffle; evaluation disjoint, complete and
unpadded; and the shard log naming the rows a stream yields. Checked against what every rank
actually yields."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from helpers import shard_logged
from hvdtrain.data import sharding, sources, tfdata

# The pipelines are hvdtrain's over tf.data calls both TensorFlow versions share; on the other
# stack the core's multi-rank tests (2 ranks x B = 1 rank x 2B, resume, the sparse and uneven
# shards) run them end to end.
pytestmark = pytest.mark.one_stack


def indexed(n: int) -> sources.Arrays:
    """x holds each sample's index (twice, to have a 2-D input), y = index % 10."""
    idx = np.arange(n, dtype=np.float32)
    return sources.Arrays(np.stack([idx, -idx], axis=1), (np.arange(n) % 10).astype(np.int32))


def _check_pairs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The sample indices of a batch, after checking x and y belong to the same samples."""
    index = x[:, 0].astype(np.int64)
    np.testing.assert_array_equal(x[:, 1], -x[:, 0])
    np.testing.assert_array_equal(y, index % 10)
    return index


N, BATCH, EPOCHS, SEED = 11, 3, 3, 17


def _all_batches(ds: tf.data.Dataset, expected: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exactly ``expected`` batches, and the dataset is exhausted after them."""
    it = ds.as_numpy_iterator()
    batches = [next(it) for _ in range(expected)]
    with pytest.raises(StopIteration):
        next(it)
    return batches


@pytest.mark.parametrize("size", [1, 2, 3])
def test_array_train_epochs_are_equal_complete_and_disjoint(size):
    split = indexed(N)
    steps = sharding.steps_per_epoch(N, size, BATCH)
    shard = sharding.padded_shard_size(N, size)
    per_rank = []
    for rank in range(size):
        stream = sources.train_dataset(split, rank=rank, size=size, batch_size=BATCH,
                                    first_epoch=0, epochs=EPOCHS, seed=SEED, shuffle=True)
        assert stream.steps_per_epoch == steps == math.ceil(math.ceil(N / size) / BATCH)
        assert stream.samples_per_epoch == shard
        batches = _all_batches(stream.dataset, EPOCHS * steps)
        epochs = []
        for e in range(EPOCHS):
            chunk = batches[e * steps:(e + 1) * steps]
            sizes = [len(x) for x, _ in chunk]
            assert all(s == BATCH for s in sizes[:-1]) and 1 <= sizes[-1] <= BATCH
            assert sum(sizes) == shard
            for x, y in chunk:
                assert x.shape[1:] == (2,) and x.dtype == np.float32 and y.dtype == np.int32
            epochs.append(np.concatenate([_check_pairs(x, y) for x, y in chunk]))
        per_rank.append(epochs)

    for e in range(EPOCHS):
        seen = [set(per_rank[r][e].tolist()) for r in range(size)]
        for r in range(size):                            # a rank sees exactly its own shard
            assert seen[r] == set(sharding.shard_indices(N, r, size).tolist())
            for q in range(r):
                assert not seen[r] & seen[q]             # unpadded shards are disjoint
        assert set().union(*seen) == set(range(N))       # every sample, every epoch
    for r in range(size):                                # shuffle: epochs differ in order
        assert not all(np.array_equal(per_rank[r][0], per_rank[r][e]) for e in range(EPOCHS))


@pytest.mark.parametrize("size", [1, 2, 3])
def test_array_train_resume_gives_the_same_batches(size):
    split = indexed(N)
    steps = sharding.steps_per_epoch(N, size, BATCH)
    for rank in range(size):
        kw = dict(rank=rank, size=size, batch_size=BATCH, epochs=EPOCHS, seed=SEED,
                  shuffle=True)
        full = _all_batches(sources.train_dataset(split, first_epoch=0, **kw).dataset,
                            EPOCHS * steps)
        for first in range(1, EPOCHS):
            stream = sources.train_dataset(split, first_epoch=first, **kw)
            assert stream.steps_per_epoch == steps
            resumed = _all_batches(stream.dataset, (EPOCHS - first) * steps)
            for (xa, ya), (xb, yb) in zip(full[first * steps:], resumed):
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)


def test_array_train_resume_at_the_last_epoch_is_empty():
    # A run resumed when it already reached train.epochs: the trainer builds the stream before
    # it checks whether anything is left to train, so this must work and yield no batches.
    stream = sources.train_dataset(indexed(N), rank=0, size=2, batch_size=BATCH,
                                first_epoch=EPOCHS, epochs=EPOCHS, seed=SEED, shuffle=True)
    assert stream.steps_per_epoch == sharding.steps_per_epoch(N, 2, BATCH)
    assert _all_batches(stream.dataset, 0) == []


def test_array_train_without_shuffle_keeps_shard_order():
    # N=7, size 2: rank 1 owns 1,3,5 and pads to 4 by wrapping around its own shard.
    stream = sources.train_dataset(indexed(7), rank=1, size=2, batch_size=3, first_epoch=0,
                                epochs=2, seed=0, shuffle=False)
    batches = _all_batches(stream.dataset, 4)
    order = [_check_pairs(x, y).tolist() for x, y in batches]
    assert order == [[1, 3, 5], [1], [1, 3, 5], [1]]


def test_array_train_seed_changes_the_order():
    kw = dict(rank=0, size=1, batch_size=N, first_epoch=0, epochs=1, shuffle=True)
    a = _all_batches(sources.train_dataset(indexed(N), seed=1, **kw).dataset, 1)[0][0]
    b = _all_batches(sources.train_dataset(indexed(N), seed=1, **kw).dataset, 1)[0][0]
    c = _all_batches(sources.train_dataset(indexed(N), seed=2, **kw).dataset, 1)[0][0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_shard_log_names_the_rows_the_stream_yields_and_is_absent_unset(tmp_path,
                                                                        monkeypatch):
    kw = dict(rank=1, size=2, batch_size=BATCH, first_epoch=0, epochs=2, seed=SEED,
              shuffle=True)
    monkeypatch.setenv(tfdata.SHARD_LOG_ENV, str(tmp_path))
    logged = sources.train_dataset(indexed(N), **kw)
    xs, ids = shard_logged(logged, tmp_path)
    rows = np.concatenate([x[:, 0] for x in xs]).astype(int).tolist()
    assert [int(i) for i in ids] == rows          # padded: the wrapped-around row twice
    # Unset, the stream has no step of the log's (its graph holds no Python call).
    monkeypatch.delenv(tfdata.SHARD_LOG_ENV)
    assert b"EagerPyFunc" in logged.dataset._as_serialized_graph().numpy()
    assert b"EagerPyFunc" not in sources.train_dataset(
        indexed(N), **kw).dataset._as_serialized_graph().numpy()


@pytest.mark.parametrize("n, size", [(7, 2), (7, 3), (11, 3), (5, 1)])
def test_array_eval_is_disjoint_complete_and_unpadded(n, size):
    split = indexed(n)
    seen = []
    for rank in range(size):
        batches = list(sources.eval_dataset(split, rank=rank, size=size, batch_size=2)
                       .as_numpy_iterator())
        assert all(len(x) <= 2 for x, _ in batches)
        idx = np.concatenate([_check_pairs(x, y) for x, y in batches])
        assert len(idx) == len(set(idx.tolist()))        # nothing twice on one rank
        seen.append(idx)
    together = np.concatenate(seen)
    assert len(together) == n                            # no padding anywhere
    assert sorted(together.tolist()) == list(range(n))   # disjoint and complete
