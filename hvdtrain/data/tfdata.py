"""tf.data building blocks every source shares: a rank's training stream, batches of sample
indices in a given order, and the rank's thread budget for parallel work."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from hvdtrain.launch import placement


AUTO_CACHE_BYTES = 1 << 30    # data.cache=auto: a rank's decoded share (float32) up to 1 GiB


def keeps_in_memory(cache: str, count: int, image_shape: tuple[int, ...]) -> bool:
    """Whether a rank keeps its ``count`` decoded samples in memory (data.cache: on, off, auto:
    when they fit). Decoding a small sample can cost more than a small model's step."""
    if cache == "auto":
        return count * 4 * math.prod(image_shape) <= AUTO_CACHE_BYTES
    return cache == "on"


@dataclass(frozen=True)
class TrainStream:
    dataset: tf.data.Dataset
    steps_per_epoch: int       # the same on every rank (unless not padded)
    samples_per_epoch: int     # on this rank (and on each other rank, unless not padded)


def with_thread_budget(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Runs ``ds``'s parallel work on this rank's share of the cores (``run.intra_op_threads``,
    set by dist.init), not on a pool sized to the whole machine."""
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    if threads <= 0:
        return ds
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    return ds.with_options(options)


# ---------------------------------------------------------------------------------------------
# A check of the sharding (the tests set it): a folder where every rank writes the ids of the
# samples its training stream yields in its first epoch, in the order yielded, one a line, to
# rank{R}.txt (R: the launcher's rank, so that a control may build another rank's stream). The
# ids travel through the stream beside the samples (an array's row, an image's path, a record's
# FILE:INDEX) and are taken off by the stream's last step; unset, the stream has neither.
SHARD_LOG_ENV = "HVDTRAIN_DEBUG_SHARD_LOG"


def shard_log() -> str | None:
    """The folder of the shard log, or None (the usual case: streams carry no ids)."""
    return os.environ.get(SHARD_LOG_ENV) or None


def carrying_ids(fn: Callable) -> Callable:
    """``fn`` (a batch of inputs -> (x, y)) for batches that carry their ids beside them."""
    return lambda inputs, ids: (*fn(inputs), ids)


def observed(ds: tf.data.Dataset, steps: int, folder: str) -> tf.data.Dataset:
    """``ds`` (batches of (x, y, ids)) as batches of (x, y), writing the ids of its first
    ``steps`` batches (the first epoch) to ``folder``/rank{R}.txt once they have passed."""
    path = Path(folder, f"rank{placement.launcher_rank()}.txt")
    seen: list[str] = []
    batches = [0]

    def record(ids: tf.Tensor) -> bool:
        if batches[0] < steps:
            seen.extend(i.decode() for i in ids.numpy())
            batches[0] += 1
            if batches[0] == steps:
                path.write_text("\n".join(seen) + "\n")
        return True

    def strip(x: tf.Tensor, y: tf.Tensor, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        done = tf.py_function(record, [ids], tf.bool)
        with tf.control_dependencies([done]):
            return tf.identity(x), tf.identity(y)
    return ds.map(strip)


def _fetching_ids(fetch: Callable, ids: list[str]) -> Callable:
    """``fetch`` giving each batch's ids beside it, gathered by the indices it fetches by."""
    names = tf.constant(ids, tf.string)
    return lambda idx: (*fetch(idx), tf.gather(names, idx))


# ---------------------------------------------------------------------------------------------

def indexed_train(orders: np.ndarray, batch_size: int,
                  fetch: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]],
                  ids: Callable[[], Sequence[str]]) -> TrainStream:
    """Batches of the sample indices in ``orders`` (one row per epoch, the last batch of an
    epoch possibly partial), each turned into (x, y) by ``fetch``, in parallel; ``ids`` (the
    id of the sample at each index) called under the shard log only."""
    folder = shard_log()
    step: Callable = fetch if not folder else _fetching_ids(fetch, list(ids()))
    ds = (tf.data.Dataset.from_tensor_slices(orders)                       # one row per epoch
          .flat_map(lambda order: tf.data.Dataset.from_tensor_slices(order).batch(batch_size))
          .map(step, num_parallel_calls=tf.data.AUTOTUNE))
    samples = orders.shape[1]
    steps = math.ceil(samples / batch_size)
    if folder:
        ds = observed(ds, steps, folder)
    return TrainStream(with_thread_budget(ds.prefetch(tf.data.AUTOTUNE)), steps, samples)


def gathered_train(x: np.ndarray, y: np.ndarray, orders: np.ndarray, batch_size: int,
                   ids: Callable[[], Sequence[str]]) -> TrainStream:
    """``indexed_train`` over samples held in memory: each batch gathered from ``x`` and ``y``
    by its positions in ``orders``."""
    x, y = tf.constant(x), tf.constant(y)
    return indexed_train(orders, batch_size, lambda pos: (tf.gather(x, pos), tf.gather(y, pos)),
                         ids)
