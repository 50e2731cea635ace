"""Sharding math: disjoint, complete, equal steps on every rank, for any (rank, size)."""
from __future__ import annotations

import numpy as np
import pytest

from hvdtrain.data import sharding

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

SIZES = [1, 2, 3, 4]
SAMPLE_COUNTS = [1, 2, 3, 4, 5, 7, 8, 10, 31, 64, 100, 1437]


VALID = [(n, size) for n in SAMPLE_COUNTS for size in SIZES if n >= size]


@pytest.mark.parametrize("n, size", VALID)
def test_shards_are_disjoint_and_complete(n, size):
    shards = [sharding.shard_indices(n, r, size) for r in range(size)]
    together = np.concatenate(shards)
    assert len(together) == n and set(together.tolist()) == set(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("n, size", VALID)
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_rank_gets_equal_work_and_every_sample_is_seen(n, size, shuffle):
    for epoch in range(3):
        orders = [sharding.epoch_order(n, r, size, epoch, seed=7, shuffle=shuffle)
                  for r in range(size)]
        assert {len(o) for o in orders} == {sharding.padded_shard_size(n, size)}
        seen = np.concatenate(orders)
        assert set(seen.tolist()) == set(range(n))            # nothing skipped
        assert len(seen) - n <= size - 1                       # at most N-1 repeats
        for r, order in enumerate(orders):                     # a rank only repeats its own
            assert set(order.tolist()) == set(sharding.shard_indices(n, r, size).tolist())


@pytest.mark.parametrize("batch", [1, 3, 32])
def test_steps_per_epoch_is_the_same_for_every_rank(batch):
    for n, size in VALID:
        steps = sharding.steps_per_epoch(n, size, batch)
        for r in range(size):
            rows = len(sharding.epoch_order(n, r, size, 0, 0, True))
            assert -(-rows // batch) == steps


def test_shuffle_depends_on_seed_and_epoch_only():
    a = sharding.epoch_order(100, 1, 2, epoch=3, seed=5, shuffle=True)
    assert np.array_equal(a, sharding.epoch_order(100, 1, 2, epoch=3, seed=5, shuffle=True))
    assert not np.array_equal(a, sharding.epoch_order(100, 1, 2, epoch=4, seed=5, shuffle=True))
    assert not np.array_equal(a, sharding.epoch_order(100, 1, 2, epoch=3, seed=6, shuffle=True))
    stacked = sharding.epoch_orders(100, 1, 2, first_epoch=2, epochs=5, seed=5, shuffle=True)
    assert stacked.shape == (3, 50) and np.array_equal(stacked[1], a)


def test_no_shuffle_keeps_the_strided_order():
    assert sharding.epoch_order(7, 1, 3, 0, 0, False).tolist() == [1, 4, 1]
    assert sharding.epoch_order(7, 0, 3, 0, 0, False).tolist() == [0, 3, 6]


def test_more_ranks_than_samples_is_a_problem():
    assert "3 samples but 4 ranks" in sharding.enough_samples_problem(3, 4)
    assert sharding.enough_samples_problem(4, 4) is None  # control: one sample each is enough


def test_bad_rank_is_a_programming_error():
    with pytest.raises(ValueError):
        sharding.shard_indices(10, 2, 2)


def test_file_sharding():
    files = [f"f{i}" for i in range(5)]
    assert sharding.shard_files(files, 0, 2) == ["f0", "f2", "f4"]
    assert sharding.shard_files(files, 1, 2) == ["f1", "f3"]
    assert sharding.shard_files(files[:1], 0, 2) is None  # fewer files than ranks
    assert sharding.records_per_rank([10, 20, 30], 2) == [40, 20]
    assert sharding.records_per_rank([7], 2) == [4, 3]


@pytest.mark.parametrize("shuffle", [False, True])
def test_unpadded_shards_hold_each_sample_once(shuffle):
    # horovod.join_uneven: no sample repeated, so ranks hold 4, 3 and 3 of 10 samples.
    orders = [sharding.epoch_order(10, r, 3, 0, seed=7, shuffle=shuffle, pad=False)
              for r in range(3)]
    assert [len(o) for o in orders] == [4, 3, 3]
    assert sorted(np.concatenate(orders).tolist()) == list(range(10))
    stacked = sharding.epoch_orders(10, 0, 3, 0, 2, seed=7, shuffle=shuffle, pad=False)
    assert stacked.shape == (2, 4)
