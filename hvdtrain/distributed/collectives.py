"""The collectives on plain tensors and Python objects, for any Keras version: sums, gathers,
broadcasts and join."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

# Horovod: plain collectives on tensors; these serve any Keras version.
import horovod.tensorflow as hvd


def join() -> int:
    """Waits, answering the peers' all-reduces with zeros, until every rank has joined; returns
    the rank that joined last."""
    # Horovod: this rank has no batch left; it answers its peers' all-reduces with zeros until
    # every rank has joined. Returns the rank that joined last (it ran the most steps).
    # Run as a graph: with horovod 0.28.1 and TF 2.15 an EAGER hvd.join() waits correctly only
    # the first time; from the second call on it returns at once on the rank that joins first
    # (measured), whose next all-reduce then meets the other rank's old one.
    return int(tf.function(hvd.join)())


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """``root_rank``'s ``obj`` (any picklable value), on every rank."""
    # Horovod: root's Python value (e.g. the epoch to resume from) reaches every rank.
    return hvd.broadcast_object(obj, root_rank=root_rank)


def allreduce_sum(values: np.ndarray) -> np.ndarray:
    """``values`` summed element-wise over all ranks, in float64."""
    # Horovod: exact totals across ranks (sums of counts, not a mean of per-rank means).
    tensor = tf.constant(np.asarray(values, dtype=np.float64))
    return hvd.allreduce(tensor, op=hvd.Sum, name="hvdtrain_sum").numpy()


def allgather_object(obj: Any) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    # Horovod: every rank's Python value, in rank order, on every rank (benchmark figures).
    return hvd.allgather_object(obj)


def allreduce_each(tensors: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
    """Sums each tensor across ranks with its own all-reduce (the optimizer reduces gradients
    as one flat tensor instead: ``reducer.py``). Called inside one tf.function, the
    all-reduces are submitted together, so Horovod fuses them into one buffer when tensor
    fusion is on."""
    # Horovod: one named all-reduce per tensor; names must match across ranks.
    return [hvd.allreduce(t, op=hvd.Sum, name=f"{name}.{i}") for i, t in enumerate(tensors)]
