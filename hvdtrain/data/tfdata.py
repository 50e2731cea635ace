"""tf.data building blocks every source shares: a rank's training stream, batches of sample
indices in a given order, and the rank's thread budget for parallel work."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf


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


def indexed_train(orders: np.ndarray, batch_size: int,
                  fetch: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]) -> TrainStream:
    """Batches of the sample indices in ``orders`` (one row per epoch, the last batch of an
    epoch possibly partial), each turned into (x, y) by ``fetch``, in parallel."""
    ds = (tf.data.Dataset.from_tensor_slices(orders)                       # one row per epoch
          .flat_map(lambda order: tf.data.Dataset.from_tensor_slices(order).batch(batch_size))
          .map(fetch, num_parallel_calls=tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE))
    samples = orders.shape[1]
    return TrainStream(with_thread_budget(ds), math.ceil(samples / batch_size), samples)


def gathered_train(x: np.ndarray, y: np.ndarray, orders: np.ndarray,
                   batch_size: int) -> TrainStream:
    """``indexed_train`` over samples held in memory: each batch gathered from ``x`` and ``y``
    by its positions in ``orders``."""
    x, y = tf.constant(x), tf.constant(y)
    return indexed_train(orders, batch_size, lambda pos: (tf.gather(x, pos), tf.gather(y, pos)))
