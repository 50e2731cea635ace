"""Which samples each rank sees: pure NumPy, testable for any (rank, size) without MPI.

Rule: rank r owns samples r, r+N, r+2N, ... (disjoint, and together every sample). Shards then
differ in length by at most one; a shorter shard repeats one of its own samples so that every
rank runs the same number of steps and none waits forever in an all-reduce. At most N-1 samples
are seen twice per epoch, none is skipped. Shuffling happens after sharding, inside each shard.
"""
from __future__ import annotations

import math

import numpy as np



def shard_indices(num_samples: int, rank: int, size: int) -> np.ndarray:
    """The samples rank ``rank`` of ``size`` owns, before padding: disjoint across ranks."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside a world of size {size}")
    return np.arange(rank, num_samples, size, dtype=np.int64)


def padded_shard_size(num_samples: int, size: int) -> int:
    """Samples per rank per epoch once shards are padded to equal length."""
    return math.ceil(num_samples / size)


def steps_per_epoch(num_samples: int, size: int, batch_size: int) -> int:
    """Steps every rank runs per epoch (the last batch may be partial, equally on every rank)."""
    return math.ceil(padded_shard_size(num_samples, size) / batch_size)


def enough_samples_problem(num_samples: int, size: int,
                           what: str = "training set") -> str | None:
    """Why ``size`` ranks cannot share ``num_samples`` samples, or None."""
    if num_samples < size:
        return (f"the {what} has {num_samples} samples but {size} ranks were launched: every "
                f"rank needs at least one; launch at most {num_samples} ranks or use more data")
    return None


def epoch_order(num_samples: int, rank: int, size: int, epoch: int, seed: int,
                shuffle: bool, pad: bool = True) -> np.ndarray:
    """This rank's sample indices for one epoch: its shard, padded (unless ``pad`` is off:
    horovod.join_uneven), shuffled by (seed, epoch).

    The order depends only on its arguments, so a run resumed at epoch k sees exactly the
    batches an uninterrupted run would have seen.
    """
    own = shard_indices(num_samples, rank, size)
    return order_of(own, padded_shard_size(num_samples, size) if pad else len(own), rank,
                    epoch, seed, shuffle)


def order_of(own: np.ndarray, width: int, rank: int, epoch: int, seed: int,
             shuffle: bool) -> np.ndarray:
    """The rank's own indices wrapped around to ``width``, shuffled by (seed, epoch, rank):
    the one rule every source's order follows."""
    padded = np.resize(own, width)  # wraps
    if shuffle:
        rng = np.random.default_rng([seed, epoch, rank])
        padded = rng.permutation(padded)
    return padded


def epoch_orders(num_samples: int, rank: int, size: int, first_epoch: int, epochs: int,
                 seed: int, shuffle: bool, pad: bool = True) -> np.ndarray:
    """``epoch_order`` for epochs first_epoch .. epochs-1, stacked: shape [epochs-first, shard]
    (no rows when a resumed run has no epoch left)."""
    own = shard_indices(num_samples, rank, size)
    width = padded_shard_size(num_samples, size) if pad else len(own)
    return orders_of(own, width, rank, first_epoch, epochs, seed, shuffle)


def orders_of(own: np.ndarray, width: int, rank: int, first_epoch: int, epochs: int,
              seed: int, shuffle: bool) -> np.ndarray:
    """``order_of`` for epochs first_epoch .. epochs-1, stacked: shape [epochs-first, width]."""
    rows = [order_of(own, width, rank, e, seed, shuffle) for e in range(first_epoch, epochs)]
    return np.array(rows, dtype=np.int64).reshape(len(rows), width)


def epoch_seeds(seed: int, rank: int, first_epoch: int, epochs: int) -> np.ndarray:
    """One int64 seed per epoch from (seed, epoch, rank), for the shuffles that tf.data does
    itself (record files): a resumed run draws the same ones as an uninterrupted run."""
    return np.array([np.random.default_rng([seed, e, rank]).integers(2**62)
                     for e in range(first_epoch, epochs)], dtype=np.int64)


def shard_files(files: list[str], rank: int, size: int) -> list[str] | None:
    """Whole files per rank when there are at least as many files as ranks, else None (the
    caller then shards record by record)."""
    if len(files) < size:
        return None
    return files[rank::size]


def records_per_rank(file_counts: tuple[int, ...] | list[int], size: int) -> list[int]:
    """Records each rank reads per pass when files are sharded as ``shard_files`` does (or,
    with fewer files than ranks, record by record)."""
    if len(file_counts) >= size:
        return [sum(file_counts[r::size]) for r in range(size)]
    total = sum(file_counts)
    return [len(shard_indices(total, r, size)) for r in range(size)]
