"""Horovod's Keras callbacks (``horovod.tensorflow.keras.callbacks``) on either Keras, for
``hvdtrain.horovod.tensorflow.keras.callbacks``.

Whichever of them a ``fit`` lists first brings ``dist.fit_callbacks()`` along, run before its
own work: the consistency check, rank 0's state broadcast by position before the first step
(Horovod's broadcasts after it), the global metrics averaged on every rank, BatchNorm
statistics in step, the stall watchdog. A script then gets hvdtrain's protections whichever
of Horovod's callbacks it lists. The learning rate callbacks compute Horovod's formulas
(``horovod_schedules.py``) and set the rate on every rank alike.
"""
from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np
import tensorflow as tf

# Horovod: the world size in the warmup formula, and rank 0 as the one that prints and writes.
import horovod.tensorflow as hvd

from hvdtrain.distributed import binding
from hvdtrain.errors import UserError
from hvdtrain.distributed import horovod_schedules as schedules

_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
          "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
          "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
          "on_predict_batch_begin", "on_predict_batch_end")


# Per model, the params of its latest fit and the callback that brought the protections into
# it (not an attribute of the model: Keras would track it and copy the params).
_RUNS: "weakref.WeakKeyDictionary[Any, tuple[dict, Any]]" = weakref.WeakKeyDictionary()


class Protected(tf.keras.callbacks.Callback):
    """The base of the callbacks here: the first of them in a fit's list runs hvdtrain's
    ``fit_callbacks(root_rank)`` at each hook, before its own work. Fit gives every callback
    of one run the same params dict, which tells one run from the next."""

    root_rank = 0

    def __init__(self) -> None:
        super().__init__()
        self.protections: list[tf.keras.callbacks.Callback] = []

    def set_params(self, params: dict) -> None:
        super().set_params(params)
        model: Any = getattr(self, "_model", None) or getattr(self, "model", None)
        owner = _RUNS.get(model)
        if owner is None or owner[0] is not params:
            _RUNS[model] = (params, self)
            # Horovod's scripts draw each rank's batches from the whole data set (its examples
            # shard nothing): the check says so, without stopping them.
            self.protections = binding.fit_callbacks(self.root_rank,
                                                     repeated_samples_stop=False)
            for callback in self.protections:
                callback.set_model(model)
                callback.set_params(params)
        elif owner[1] is not self:
            self.protections = []


def _forwarding(hook: str) -> Any:
    own = getattr(tf.keras.callbacks.Callback, hook)

    def forward(self: Protected, *args: Any, **kwargs: Any) -> None:
        for callback in self.protections:
            getattr(callback, hook)(*args, **kwargs)
        getattr(self, f"own_{hook}", lambda *a, **k: own(self, *a, **k))(*args, **kwargs)
    forward.__name__ = hook
    return forward


for _hook in _HOOKS:
    setattr(Protected, _hook, _forwarding(_hook))


class BroadcastGlobalVariablesCallback(Protected):
    """Rank ``root_rank``'s weights and optimizer state on every rank before the first step
    (with the protections above; ``dist.fit_callbacks()`` does the broadcast)."""

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None):
        super().__init__()
        if local_variables:
            raise UserError("hvdtrain.horovod: BroadcastGlobalVariablesCallback("
                            "local_variables=...) is not offered: hvdtrain keeps every "
                            "variable equal on every rank, and its consistency check compares "
                            "them")
        self.root_rank = root_rank


class MetricAverageCallback(Protected):
    """The epoch's metrics the same on every rank: hvdtrain's global metrics (each metric's
    state added over the ranks), then averaged over ranks (what else a callback logged)."""

    def __init__(self, device: str = ""):
        super().__init__()


def learning_rate(optimizer: Any) -> float:
    rate = getattr(optimizer, "learning_rate", None)
    if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule) or callable(rate):
        raise UserError("hvdtrain.horovod: the learning rate callbacks set the optimizer's "
                        "rate, which here is a schedule: pass a number as learning_rate")
    return float(np.asarray(rate))


def momentum_buffers(optimizer: Any) -> list[Any] | None:
    """The optimizer's momentum slots (SGD's, RMSprop's), or None where it has no momentum."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    if not getattr(optimizer, "momentum", 0):
        return None
    slots = getattr(optimizer, "momentums", None) or getattr(optimizer, "_momentums", None)
    if slots is None and getattr(optimizer, "built", False):
        raise UserError(f"hvdtrain.horovod: momentum_correction does not know "
                        f"{type(optimizer).__name__}'s momentum: pass momentum_correction=False")
    return list(slots or [])


class LearningRateScheduleCallback(Protected):
    """Horovod's schedule: the rate ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to
    ``end_epoch``, set at each epoch's first batch (``staircase``) or before every batch at the
    fractional epoch. ``momentum_correction`` (Goyal et al.): where the rate changes from old
    to new, the step's momentum is multiplied by new/old, which hvdtrain does by scaling the
    momentum slots by new/old before the step (the same update for SGD and RMSprop; Keras'
    momentum is a constant of the traced step, which Horovod's way of changing it would miss)."""

    def __init__(self, initial_lr: float, multiplier: Any, start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None):
        super().__init__()
        if initial_lr is None:
            raise UserError("hvdtrain.horovod: LearningRateScheduleCallback needs initial_lr")
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.multiplier = (multiplier if callable(multiplier)
                           else schedules.exponential(multiplier, start_epoch))
        self.current_epoch = 0

    def own_on_train_begin(self, logs: dict | None = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = schedules.steps_per_epoch(self.params)
            if not self.steps_per_epoch:
                raise UserError(f"hvdtrain.horovod: {type(self).__name__} cannot tell the "
                                f"steps per epoch of this fit: pass steps_per_epoch=")

    def own_on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def own_on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        epoch = schedules.adjusted_epoch(self.current_epoch, batch, start_epoch=self.start_epoch,
                                         end_epoch=self.end_epoch, staircase=self.staircase,
                                         steps_per_epoch=self.steps_per_epoch)
        if epoch is not None:
            self._set(self.initial_lr * self.multiplier(epoch))

    def _set(self, new: float) -> None:
        optimizer = self.model.optimizer
        old = learning_rate(optimizer)
        optimizer.learning_rate = new
        slots = momentum_buffers(optimizer) if self.momentum_correction else None
        if slots and old and new != old:
            for slot in slots:
                slot.assign(slot * (new / old))

    def own_on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warmup (Goyal et al.): from ``initial_lr / size`` to ``initial_lr`` (the rate
    already scaled by the world size) over ``warmup_epochs``, batch by batch."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0):
        super().__init__(initial_lr, lambda epoch: 1.0, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs, self.verbose = warmup_epochs, verbose

    def own_on_train_begin(self, logs: dict | None = None) -> None:
        super().own_on_train_begin(logs)
        # Horovod: the world size the rate is warmed up over.
        self.multiplier = schedules.warmup(hvd.size(), self.warmup_epochs,
                                           int(self.steps_per_epoch or 1))

    def own_on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().own_on_epoch_end(epoch, logs)
        # Horovod: rank 0 alone prints.
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{learning_rate(self.model.optimizer):g}.", file=sys.stdout)


class BestModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
    """Horovod's: ``ModelCheckpoint`` keeping the best model by ``monitor``, written by rank 0
    alone (every rank reads the same averaged logs). ``filepath`` (Horovod's Spark estimator
    sets it later) must be set before fit."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto",
                 save_freq: Any = "epoch", filepath: str | None = None):
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
        self.filepath_given = filepath is not None

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.filepath_given and self.filepath in ("best.keras", "best.weights.h5"):
            raise UserError("hvdtrain.horovod: BestModelCheckpoint has no filepath: pass "
                            "filepath= (Horovod's Spark estimator sets it for you)")
        super().on_train_begin(logs)

    def _save_model(self, *args: Any, **kwargs: Any) -> None:
        # Horovod: rank 0 alone writes.
        if hvd.rank() == 0:
            super()._save_model(*args, **kwargs)
