"""Exact metrics over all ranks: each rank sums loss, correct predictions and count over its
own samples, and the sums (never per-rank means) are added across ranks. The custom loop's
train metrics and the eval set's metrics are both made this way."""
from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from hvdtrain.data import sources
from hvdtrain import distributed as dist


def batch_sums(losses: tf.Tensor, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """[sum of per-sample losses, correct predictions, samples] of one batch, in float64."""
    hits = tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), tf.cast(y, tf.int32))
    return tf.stack([tf.reduce_sum(tf.cast(losses, tf.float64)),
                     tf.reduce_sum(tf.cast(hits, tf.float64)),
                     tf.cast(tf.size(y), tf.float64)])


def totals(sums: np.ndarray) -> tuple[float, float, int]:
    """(mean loss, accuracy, samples) over every rank's samples: a collective."""
    loss_sum, correct, count = dist.allreduce_sum(sums)  # Horovod: sums of all ranks
    return loss_sum / count, correct / count, int(count)


def exact_evaluator(model: tf.keras.Model, split: sources.Split, world: dist.World,
                    batch_size: int) -> Callable[[], dict]:
    """A function giving loss and accuracy over the WHOLE eval set, each rank scoring its
    disjoint shard. Every rank must call it (a collective). The shard and the step are built
    once and reused at every epoch."""
    shard = sources.eval_dataset(split, rank=world.rank, size=world.size, batch_size=batch_size)

    @tf.function
    def sums_of(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        logits = tf.cast(model(x, training=False), tf.float32)
        losses = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        return batch_sums(losses, logits, y)

    def evaluate() -> dict:
        sums = np.zeros(3, np.float64)
        for x, y in shard:
            sums += sums_of(x, y).numpy()
        loss, accuracy, count = totals(sums)
        return {"eval_loss": loss, "eval_accuracy": accuracy, "eval_samples": count}
    return evaluate
