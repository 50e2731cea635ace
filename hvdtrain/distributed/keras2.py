"""The Keras 2 binding (tf.keras in TensorFlow 2.15): Horovod's own Keras layer.

Everything here depends on which Keras is installed; ``hvdtrain.distributed`` picks this module when
``tf.keras`` is Keras 2 and calls it through the functions listed in its ``KerasBinding``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import tensorflow as tf

# Horovod: plain collectives on tensors.
import horovod.tensorflow as hvd
# Horovod: the Keras 2 wrapper: DistributedOptimizer, callbacks and elastic state.
import horovod.tensorflow.keras as hvd_keras

from hvdtrain.config import HorovodConfig
from hvdtrain.distributed.reducer import mark_reduced, refuse_reduced
from hvdtrain.distributed.reduction import compression, reduce_op
from hvdtrain.errors import UserError

T = TypeVar("T")


def distributed_optimizer(optimizer: tf.keras.optimizers.Optimizer,
                          options: HorovodConfig) -> tf.keras.optimizers.Optimizer:
    """Horovod's DistributedOptimizer around ``optimizer``, refusing gradients a distributed
    tape reduced already, with what was set on ``optimizer`` outside its config. Refuses
    Adasum, which Horovod's Keras optimizer does not take."""
    if options.op == "adasum":
        raise UserError("on Keras 2 Horovod's Keras DistributedOptimizer averages or sums only: "
                        "for Adasum use dist.distributed_tape with a plain optimizer "
                        "(hvdtrain's custom loop, --loop custom)")
    # Horovod: average gradients across ranks with ring all-reduce before every update
    # (compressed to float16 on the wire if asked; sparse gradients reduced densely if asked).
    distributed = hvd_keras.DistributedOptimizer(optimizer, compression=compression(options),
                                                 sparse_as_dense=options.sparse_as_dense)
    # Horovod rebuilds the optimizer from its config: what the user set outside it (AdamW's
    # exclude_from_weight_decay, say) is carried over, or it would be silently lost.
    for name, value in vars(optimizer).items():
        if name not in vars(distributed) and not name.startswith("_self_"):
            setattr(distributed, name, value)
    apply_gradients = distributed.apply_gradients

    def refusing_reduced(grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        refuse_reduced([grad for grad, _ in grads_and_vars])
        return apply_gradients(grads_and_vars, *args, **kwargs)

    distributed.apply_gradients = refusing_reduced
    return distributed


def distributed_tape(tape: tf.GradientTape, options: HorovodConfig) -> tf.GradientTape:
    """Horovod's DistributedGradientTape around ``tape``; what its gradient() returns is
    recorded as reduced, so that a distributed optimizer refuses it."""
    # Horovod: tape.gradient() returns gradients already reduced across ranks (average or
    # Adasum), so every rank applies the same update.
    reducing = hvd.DistributedGradientTape(tape, compression=compression(options),
                                           sparse_as_dense=options.sparse_as_dense,
                                           op=reduce_op(options))
    gradient = reducing.gradient
    reducing.gradient = lambda target, sources, *args, **kwargs: mark_reduced(
        gradient(target, sources, *args, **kwargs))
    return reducing


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    hvd.broadcast_variables(list(variables), root_rank=root_rank)  # Horovod: root's values


def broadcast_callback(root_rank: int = 0) -> tf.keras.callbacks.Callback:
    # Horovod: after the first batch (Keras 2 creates the optimizer's slots in it), root's
    # weights and optimizer state on every rank.
    return hvd_keras.callbacks.BroadcastGlobalVariablesCallback(root_rank)


def optimizer_variables(optimizer: tf.keras.optimizers.Optimizer) -> list[tf.Variable]:
    return list(optimizer.variables())  # a method in Keras 2


def metric_average_callback() -> tf.keras.callbacks.Callback:
    # Horovod: the epoch's train metrics become the mean over ranks before anyone logs them.
    return hvd_keras.callbacks.MetricAverageCallback()


def elastic_state(model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                  **values: Any) -> Any:
    # Horovod: what elastic training commits in memory and syncs to new workers: weights,
    # optimizer slots and plain values (the epoch, the run directory).
    return hvd_keras.elastic.KerasState(model, optimizer=optimizer, **values)


def run_elastic(train: Callable[[Any], T]) -> Callable[[Any], T]:
    # Horovod: re-runs ``train`` after a worker is lost (state rolled back to the last commit)
    # or added (at the next commit), each time on the new ring, after syncing state from rank 0.
    return hvd_keras.elastic.run(train)


def save_model(model: tf.keras.Model, path: Path) -> None:
    # Keras 2 writes a TensorFlow SavedModel directory (tf.keras.models.load_model reads it).
    model.save(str(path), include_optimizer=False, save_format="tf")


def load_model(folder: Path) -> tf.keras.Model:
    # Keras 2 reads the SavedModel directory back; no optimizer is needed to predict.
    return tf.keras.models.load_model(str(folder), compile=False)


def scale_loss(optimizer: tf.keras.optimizers.Optimizer, loss: tf.Tensor) -> tf.Tensor:
    return optimizer.get_scaled_loss(loss)  # Keras 2's LossScaleOptimizer


def unscale_gradients(optimizer: tf.keras.optimizers.Optimizer,
                      gradients: list[tf.Tensor]) -> list[tf.Tensor]:
    return optimizer.get_unscaled_gradients(gradients)


def apply_scaled_gradients(optimizer: tf.keras.optimizers.Optimizer, gradients: list[tf.Tensor],
                           variables: Sequence[tf.Variable]) -> None:
    # Keras 2's LossScaleOptimizer applies what it is given: unscale first.
    optimizer.apply_gradients(zip(unscale_gradients(optimizer, gradients), variables))


def sync_batch_normalization_class() -> type:
    # Horovod: its Keras 2 layer all-reduces each training step's moments over the ranks.
    return hvd.SyncBatchNormalization
