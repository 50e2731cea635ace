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
import inspect
from typing import Any, Callable

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
IN_STEP = "_hvdtrain_in_step"      # on the model: a train or test step runs now


def _set(model: Any, name: str, value: Any) -> None:
    # Set around Keras' attribute tracking: the model's own from now on.
    object.__setattr__(model, name, value)


def make_metrics_global(model: Any) -> None:
    """``model``'s metric results, wherever Keras reads them outside a step while a
    ``GlobalMetrics`` holds it (fit's epoch ends and validation, an evaluate() given one), come
    from their state added over the ranks first. Inside a step (``run_eagerly=True`` reads the
    results after every batch) they stay the rank's own, or every batch would be added again.
    A hold lasts no longer than the call it began in, also when that call raises: the model's
    ``fit``, ``train_on_batch`` and ``test_on_batch`` start without one, and its ``evaluate``
    keeps the one it is in (fit's validation) only when given a GlobalMetrics (fit passes its
    own callbacks)."""
    read = model.get_metrics_result
    if getattr(read, "hvdtrain_global", False):
        return
    summed: list[list[np.ndarray] | None] = [None]

    @functools.wraps(read)
    def get_metrics_result() -> Any:
        # Horovod: alone, a rank's state is the global one; traced, Keras reads per step.
        if (getattr(model, HELD, 0) and not getattr(model, IN_STEP, False)
                and tf.executing_eagerly() and hvd.size() > 1):
            variables = metric_variables(model)
            if add_over_ranks(variables, summed[0]):
                summed[0] = [np.asarray(v.numpy()) for v in variables]
        return read()

    get_metrics_result.hvdtrain_global = True  # type: ignore[attr-defined]
    _set(model, "get_metrics_result", get_metrics_result)
    _set(model, "fit", scoped(model, model.fit, keep=lambda _: False, after=lambda _: 0))
    _set(model, "evaluate", scoped(model, model.evaluate, keep=holds, after=lambda held: held))
    for name in ("train_on_batch", "test_on_batch"):
        _set(model, name, scoped(model, getattr(model, name), keep=lambda _: False,
                                 after=lambda held: held))


def holds(callbacks: Any) -> bool:
    """Whether ``callbacks`` (a list, or the CallbackList fit gives its validation) hold a
    GlobalMetrics."""
    return any(isinstance(c, GlobalMetrics)
               for c in (getattr(callbacks, "callbacks", callbacks) or ()))


def scoped(model: Any, method: Callable, *, keep: Callable[[Any], bool],
           after: Callable[[int], int]) -> Callable:
    """``method`` run with the model's hold kept if ``keep(its callbacks)``, else none, and
    set to ``after(the hold it found)`` when it returns or raises."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        held = getattr(model, HELD, 0)
        try:
            given = signature.bind_partial(*args, **kwargs).arguments.get("callbacks")
        except TypeError:
            given = None   # Keras reports the bad arguments itself
        _set(model, HELD, held if keep(given) else 0)
        _set(model, IN_STEP, False)   # a step that raised ended with its call
        try:
            return method(*args, **kwargs)
        finally:
            _set(model, HELD, after(held))
    return call


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
        _set(self.model, HELD, getattr(self.model, HELD, 0) + change)

    def _step(self, running: bool) -> None:
        _set(self.model, IN_STEP, running)

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

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._step(True)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._step(False)

    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._step(True)

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._step(False)
