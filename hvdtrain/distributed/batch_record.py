"""What the model's train step records for the consistency check (``consistency.py``), in the
graph: the first batch's checksum, and a MinHash signature of the samples of the first epoch
(``divergence.repeated_samples`` compares them across ranks). Recording is armed per ``fit``
and costs a hash of each batch's inputs only while armed.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from hvdtrain.distributed.divergence import NO_SAMPLE


def _numeric(dtype: tf.DType) -> bool:
    return dtype.is_floating or dtype.is_integer or dtype.is_bool


def batch_checksum(data: Any) -> tf.Tensor:
    """[sum, sum of squares, elements] over a batch's numeric tensors, in float64."""
    parts = [tf.cast(tf.reshape(t, [-1]), tf.float64) for t in tf.nest.flatten(data)
             if isinstance(t, (tf.Tensor, np.ndarray)) and _numeric(tf.as_dtype(t.dtype))]
    if not parts:
        return tf.zeros([3], tf.float64)
    values = tf.concat(parts, 0)
    return tf.stack([tf.reduce_sum(values), tf.reduce_sum(values * values),
                     tf.cast(tf.size(values), tf.float64)])


HASHES = 64  # MinHash functions: a share of common samples to within about 1/8


def _mix(z: tf.Tensor) -> tf.Tensor:
    """SplitMix64's finalizer on int64 (wrapping): nearby keys to unrelated hashes."""
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 30)) * -4658895280553007687
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 27)) * -7723592293110705685
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 31))


def sample_hashes(data: Any) -> tf.Tensor:
    """[batch, HASHES] int64: each sample of the batch's first numeric tensor (its inputs),
    keyed by a weighted sum of its values, under HASHES hash functions."""
    parts = [t for t in tf.nest.flatten(data)
             if isinstance(t, tf.Tensor) and _numeric(t.dtype) and t.shape.rank]
    if not parts:
        return tf.zeros([0, HASHES], tf.int64)
    rows = tf.cast(tf.reshape(parts[0], [tf.shape(parts[0])[0], -1]), tf.float64)
    weights = tf.sin(tf.cast(tf.range(tf.shape(rows)[1]), tf.float64) * 0.7 + 0.3) + 2.0
    keys = tf.bitcast(tf.linalg.matvec(rows, weights), tf.int64)
    seeds = tf.constant([i * 0x9E3779B97F4A7C15 % 2**63 for i in range(1, HASHES + 1)],
                        tf.int64)
    return _mix(keys[:, None] + seeds[None, :])


class BatchRecord:
    """Variables the model's train step fills while armed: the first batch's checksum, and the
    MinHash signature of the samples of the first epoch (``divergence.repeated_samples``)."""

    def __init__(self) -> None:
        self.first = tf.Variable(False, trainable=False)
        self.epoch = tf.Variable(False, trainable=False)
        self.sums = tf.Variable(tf.zeros([3], tf.float64), trainable=False)
        self.signature = tf.Variable(tf.fill([HASHES], tf.constant(NO_SAMPLE, tf.int64)),
                                     trainable=False)

    def arm(self) -> None:
        self.first.assign(True)
        self.epoch.assign(True)
        self.signature.assign(tf.fill([HASHES], tf.constant(NO_SAMPLE, tf.int64)))

    def record(self, data: Any) -> None:
        """In the train step (traced): the batch's share of the record, while armed."""
        def first_batch() -> tf.Tensor:
            self.sums.assign(batch_checksum(data))
            return self.first.assign(False).read_value()

        def signature() -> tf.Tensor:
            least = tf.reduce_min(sample_hashes(data), axis=0)  # int64 max for no sample
            return self.signature.assign(tf.minimum(self.signature, least)).read_value()

        tf.cond(self.first, first_batch, lambda: tf.identity(self.first))
        tf.cond(self.epoch, signature, lambda: tf.identity(self.signature))

    def first_batch(self) -> tuple[float, ...]:
        return tuple(float(x) for x in self.sums.numpy())

    def first_epoch(self) -> tuple[int, ...]:
        self.epoch.assign(False)
        return tuple(int(x) for x in self.signature.numpy())


def batch_record(model: Any) -> BatchRecord:
    """The model's train step made to fill a ``BatchRecord`` (armed now): the train function
    is made again once per model, then only armed."""
    record = getattr(model, "_hvdtrain_batch_record", None)
    if record is None:
        record = BatchRecord()
        step = model.train_step

        def train_step(data: Any) -> Any:
            record.record(data)
            return step(data)
        # Set around Keras' attribute tracking: nothing here belongs in a checkpoint.
        object.__setattr__(model, "train_step", train_step)
        object.__setattr__(model, "_hvdtrain_batch_record", record)
        model.make_train_function(force=True)
    record.arm()
    return record
