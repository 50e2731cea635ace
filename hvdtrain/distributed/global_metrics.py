"""Metrics every rank reads as the global ones, on either Keras.

A metric's result over all ranks' samples is not the mean of its per-rank results where it is
not a plain mean of equal parts: AUC, precision and recall divide sums, a count adds up. Every
built-in Keras metric keeps its state as sums (totals and counts, true and false positives at
thresholds, confusion matrices), so here each metric's variables are added over the ranks
before its result is read: the result is then what one process over every rank's samples would
compute. ``GlobalMetrics`` does that where Keras reads the results during ``fit`` (its
epochs and validation: ``dist.fit_callbacks()`` holds one) or an ``evaluate()`` given one. A
custom metric whose state is not a sum (a running maximum, say) would come out wrong, which is
why ``dist.fit_callbacks(global_metrics=False)`` turns it off.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf

# Horovod: the metrics' state added over the ranks, and their layouts compared.
import horovod.tensorflow as hvd

from hvdtrain.errors import UserError


def metric_variables(model: Any) -> list[Any]:
    """Every variable of the model's metrics, each once, in the metrics' order."""
    seen: dict[int, Any] = {}
    for metric in model.metrics:
        for variable in metric.variables:
            seen.setdefault(id(variable), variable)
    return list(seen.values())


def add_over_ranks(variables: list[Any], summed: list[np.ndarray] | None) -> bool:
    """A collective: ``variables`` (the metrics' state) replaced by their sums over the ranks,
    unless no rank's state changed since ``summed``, the sums of the last call (Keras may read
    the results twice: adding again would count every sample N times). True if it added."""
    values = [np.asarray(v.numpy()) for v in variables]
    changed = summed is None or any(not np.array_equal(a, b) for a, b in zip(values, summed))
    layout = [(tuple(v.shape), tf.as_dtype(v.dtype).name) for v in variables]
    # Horovod: every rank's layout and whether its state changed, so that all take one branch.
    views = hvd.allgather_object((layout, changed), name="hvdtrain_metric_layout")
    if any(other != views[0][0] for other, _ in views):
        raise UserError("the ranks compile different metrics, whose states cannot be added: "
                        "compile the same metrics on every rank", shared=True)
    if not any(flag for _, flag in views) or not variables:
        return False
    if not all(flag for _, flag in views):
        raise UserError("the ranks read their metrics at different points (one has not "
                        "trained or evaluated since the last reading): call fit and evaluate "
                        "on every rank alike", shared=True)
    flat = np.concatenate([value.astype(np.float64).ravel() for value in values])
    # Horovod: one all-reduce of every metric's state, by position.
    total = hvd.allreduce(tf.constant(flat), op=hvd.Sum, name="hvdtrain_metric_states").numpy()
    start = 0
    for variable, value in zip(variables, values):
        variable.assign(total[start:start + value.size].reshape(value.shape).astype(value.dtype))
        start += value.size
    return True


HELD = "_hvdtrain_global_metrics"  # on the model: how many GlobalMetrics hold it global now


def make_metrics_global(model: Any) -> None:
    """``model``'s metric results, wherever Keras reads them outside a traced step while a
    ``GlobalMetrics`` holds it (fit's epoch ends and validation, an evaluate() given one), come
    from their state added over the ranks first."""
    read = model.get_metrics_result
    if getattr(read, "hvdtrain_global", False):
        return
    summed: list[list[np.ndarray] | None] = [None]

    @functools.wraps(read)
    def get_metrics_result() -> Any:
        # Horovod: alone, a rank's state is the global one; traced, Keras reads per step.
        if getattr(model, HELD, 0) and tf.executing_eagerly() and hvd.size() > 1:
            variables = metric_variables(model)
            if add_over_ranks(variables, summed[0]):
                summed[0] = [np.asarray(v.numpy()) for v in variables]
        return read()

    get_metrics_result.hvdtrain_global = True  # type: ignore[attr-defined]
    # Set around Keras' attribute tracking: the model's own from now on.
    object.__setattr__(model, "get_metrics_result", get_metrics_result)


class GlobalMetrics(tf.keras.callbacks.Callback):
    """While ``fit`` (its History and validation) or an ``evaluate(callbacks=[GlobalMetrics()])``
    runs, the model's metric results are the global ones (``make_metrics_global``). A
    collective: every rank fits, or evaluates, with it. Outside them, as in an evaluate() on
    rank 0 alone, the model reads its own metrics as plain Keras does."""

    def __init__(self) -> None:
        super().__init__()
        self.training = False

    def _hold(self, change: int) -> None:
        make_metrics_global(self.model)
        object.__setattr__(self.model, HELD, getattr(self.model, HELD, 0) + change)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.training = True
        self._hold(1)

    def on_train_end(self, logs: dict | None = None) -> None:
        self.training = False
        self._hold(-1)

    def on_test_begin(self, logs: dict | None = None) -> None:
        if not self.training:  # fit's validation is held already
            self._hold(1)

    def on_test_end(self, logs: dict | None = None) -> None:
        if not self.training:
            self._hold(-1)
