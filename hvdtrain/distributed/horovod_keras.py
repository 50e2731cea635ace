"""Horovod's Keras API (``horovod.tensorflow.keras``) on either Keras: what
``hvdtrain.horovod.tensorflow.keras`` exports besides the names it shares with
``horovod.tensorflow`` (``horovod_api.py``).

Horovod's Keras collectives take and return plain values (NumPy), where its TF ones take and
return tensors; ``load_model`` reads a model saved with a wrapped optimizer and wraps its
optimizer again.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

# Horovod: its collectives on tensors, under the Keras API's value-in, value-out calls.
import horovod.tensorflow as hvd

from hvdtrain.distributed import binding, horovod_api
from hvdtrain.distributed.horovod_api import Average, Compression, global_process_set


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Any = None,
              compression: Any = Compression.none) -> np.ndarray:
    """``value`` reduced over ranks (averaged by default), as a NumPy value."""
    if average is None and op is None:
        op = Average
    # Horovod: its all-reduce of the value as a tensor.
    return hvd.allreduce(tf.constant(value, name=name), average=average, op=op,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         compression=compression).numpy()


def allgather(value: Any, name: str | None = None) -> np.ndarray:
    """Every rank's ``value`` concatenated along its first axis, in rank order."""
    # Horovod: its all-gather of the value as a tensor.
    return hvd.allgather(tf.constant(value, name=name)).numpy()


def broadcast(value: Any, root_rank: int, name: str | None = None) -> np.ndarray:
    """``root_rank``'s ``value`` on every rank."""
    # Horovod: its broadcast of the value as a tensor.
    return hvd.broadcast(tf.constant(value, name=name), root_rank).numpy()


def reducescatter(value: Any, name: str | None = None, op: Any = Average) -> np.ndarray:
    """``value`` reduced over ranks, this rank's part of its first axis."""
    # Horovod: its reduce-scatter of the value as a tensor.
    return hvd.reducescatter(tf.constant(value, name=name), op=op).numpy()


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: Any = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Horovod's Keras ``DistributedOptimizer``: see ``horovod_api.DistributedOptimizer``."""
    return horovod_api.DistributedOptimizer(
        optimizer, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set)


def load_model(filepath: str, custom_optimizers: Any = None, custom_objects: Any = None,
               compression: Any = Compression.none, legacy_opts: bool = False) -> Any:
    """A model saved with a distributed optimizer, loaded with its optimizer's state, and that
    optimizer made distributed again: ready for ``fit`` (whose protections broadcast rank 0's
    state)."""
    objects = dict(custom_objects or {})
    for optimizer in custom_optimizers or []:
        objects.setdefault(optimizer.__name__, optimizer)
    model = tf.keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        config = horovod_api.options("load_model", compression=compression)
        model.optimizer = binding.horovod_optimizer(model.optimizer, config,
                                                    average_aggregated=True)
    return model
