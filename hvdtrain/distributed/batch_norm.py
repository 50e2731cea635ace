"""Batch normalization across ranks, on either Keras: the moving statistics made the same on
every rank, and synchronized batch normalization (each step's moments over all ranks' batches).

The all-reduce of the gradients keeps the trainable weights identical, but a
``BatchNormalization`` layer's moving mean and variance are each rank's own: every rank
averages its own batches' moments into them, so the same input would give different outputs
on different ranks, and what one rank evaluates, checkpoints or exports is not what another
holds. ``average_statistics`` replaces them with their mean over ranks (one all-reduce): the
mean, not rank 0's, because it keeps every rank's data (the moving mean of N ranks at batch B,
averaged after every step, equals one rank's at N x B; averaged at an epoch's end it is the
closest estimate of the global batch's), where rank 0's would throw N - 1 ranks' data away.
``statistics_average_callback`` does it in ``fit`` (in ``dist.fit_callbacks()`` and in
hvdtrain's trainer) before every evaluation, at each epoch's end and at the end of training.

``SyncBatchNormalization`` (Keras 3; Keras 2 uses Horovod's own, see ``binding``) computes a
training step's moments over the global batch, so N ranks at batch B normalize as one rank at
N x B does; ``sync_batch_norm.synchronize_batch_norm`` turns a built model's
``BatchNormalization`` layers into it (``model.sync_batch_norm``).
"""
from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np
import tensorflow as tf

# Horovod: plain collectives on tensors; no Keras inside.
import horovod.tensorflow as hvd

from hvdtrain.launch import rank_env

STATISTICS_NAME = "hvdtrain_normalization_statistics"


def normalization_statistics(model: tf.keras.Model) -> list[Any]:
    """The moving statistics of ``model``'s BatchNormalization layers (nested ones included,
    each once), in the order of Keras' walk over its layers, the same for the same model on
    every rank: their float non-trainable variables. Not the other non-trainable state (Keras
    3's integer seed generator states, an optimizer's slots)."""
    found: list[Any] = []
    seen: set[int] = set()
    # Keras' own walk over a model's layers, nested models and sublayers included (either Keras).
    for layer in model._flatten_layers(include_self=False):
        if not isinstance(layer, tf.keras.layers.BatchNormalization):
            continue
        for variable in layer.non_trainable_weights:
            if tf.as_dtype(variable.dtype).is_floating and id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
    return found


def average_statistics(model: tf.keras.Model) -> int:
    """A collective: ``model``'s normalization statistics become their mean over ranks, the
    same on every rank; returns how many variables. No collective at one rank or where the
    model has no such statistics (every rank decides alike: the model is the same)."""
    variables = normalization_statistics(model)
    if not variables or hvd.size() == 1:  # Horovod: one rank holds the mean already
        return 0
    values = [np.asarray(variable.numpy()) for variable in variables]
    flat = np.concatenate([value.astype(np.float64).ravel() for value in values])
    # Horovod: one all-reduce of every statistic, by position under one fixed name (a
    # variable's name is numbered per process by Keras, so it cannot name the collective).
    means = hvd.allreduce(tf.constant(flat), op=hvd.Average, name=STATISTICS_NAME).numpy()
    start = 0
    for variable, value in zip(variables, values):
        variable.assign(means[start:start + value.size].reshape(value.shape).astype(value.dtype))
        start += value.size
    return len(variables)


class StatisticsAverage(tf.keras.callbacks.Callback):
    """``fit``'s model gets the mean normalization statistics of all ranks before every
    evaluation (``validation_data``), at each epoch's end (before the callbacks after it
    evaluate or checkpoint) and when training ends (before an export). Every rank must run it."""

    def on_test_begin(self, logs: dict | None = None) -> None:
        average_statistics(self.model)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        average_statistics(self.model)

    def on_train_end(self, logs: dict | None = None) -> None:
        average_statistics(self.model)


def statistics_average_callback() -> tf.keras.callbacks.Callback:
    """A fit callback: the normalization statistics averaged over ranks (see above)."""
    return StatisticsAverage()


# The sync layers' all-reduces traced so far in each graph: their names, by call order.
_TRACED: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def _moments_name() -> str:
    """A name for one layer's all-reduce that is the same on every rank: its place among the
    synchronized layers' calls in the graph being traced (every rank traces the same step),
    never a layer's name, which Keras numbers per process."""
    if tf.executing_eagerly():  # eager all-reduces run one after the other
        return "hvdtrain_sync_batch_norm"
    graph = tf.compat.v1.get_default_graph()
    index = _TRACED.get(graph, 0)
    _TRACED[graph] = index + 1
    return f"hvdtrain_sync_batch_norm_{index}"


def _sum_over_ranks(tensor: tf.Tensor, name: str) -> tf.Tensor:
    """``tensor`` summed over ranks, with its gradient the sum over ranks of the gradients
    (each rank's loss depends on every rank's sums), under names of its own."""

    @tf.custom_gradient
    def summed(local: tf.Tensor) -> Any:
        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            # Horovod: every rank's loss depends on these sums, so each rank's share of the
            # gradient is the sum of all ranks' gradients with respect to them.
            return hvd.allreduce(upstream, op=hvd.Sum, name=f"{name}_gradient",
                                 ignore_name_scope=True)
        # Horovod: the batch's sums over every rank's batch; the name alone, without the
        # layer's name scope (numbered per process by Keras) that Horovod would put before it.
        return hvd.allreduce(local, op=hvd.Sum, name=name, ignore_name_scope=True), gradient
    return summed(tensor)


@tf.keras.utils.register_keras_serializable(package="hvdtrain")
class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """Keras 3's ``BatchNormalization`` whose training moments are those of the global batch:
    each rank's sum of x, of x squared and count, summed over ranks in one all-reduce (as
    Horovod's Keras 2 layer and Keras' own ``synchronized=True`` under tf.distribute do), so N
    ranks at batch B compute what one rank at N x B does, gradients included. At one rank, and
    in inference, it is the plain layer. Never on the fused kernel (``fused_norm`` takes only
    the plain class). Loads back where ``hvdtrain.distributed`` is imported."""

    def _moments(self, inputs: Any, mask: Any) -> Any:
        # Horovod: one rank has nothing to combine with; not under elastic training, where a
        # step traced at size 1 may run after workers join.
        if hvd.size() == 1 and not rank_env.is_elastic(os.environ):
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        x = tf.convert_to_tensor(inputs)
        if mask is None:
            weights = tf.ones_like(x)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1),
                                              tf.shape(x)), x.dtype)
        local = tf.stack([tf.reduce_sum(x * weights, axes, keepdims=True),
                          tf.reduce_sum(tf.square(x) * weights, axes, keepdims=True),
                          tf.reduce_sum(weights, axes, keepdims=True)])
        total, squares, count = tf.unstack(_sum_over_ranks(local, _moments_name()))
        mean = tf.math.divide_no_nan(total, count)
        # var = E(x^2) - E(x)^2, as Keras' own synchronized moments
        variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
        return tf.squeeze(mean, axes), tf.squeeze(variance, axes)
