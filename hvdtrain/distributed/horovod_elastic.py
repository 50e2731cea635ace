"""Horovod's elastic API (``horovod.tensorflow.elastic``, ``horovod.tensorflow.keras.elastic``)
on either Keras: the state hvdtrain's binding commits, restores and syncs (Keras 3 variables
included), Horovod's retry loop, and its three Keras callbacks."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

import tensorflow as tf

from hvdtrain.distributed import binding, elastic_retry

T = TypeVar("T")


def run(func: Callable[..., T]) -> Callable[..., T]:
    """``func(state, ...)`` in Horovod's elastic retry loop (horovodrun's elastic mode)."""
    return elastic_retry.run(func)


def KerasState(model: tf.keras.Model, optimizer: Any = None, backend: Any = None,
               **kwargs: Any) -> Any:
    """What elastic training commits and syncs: the model's and its optimizer's variables,
    and ``kwargs`` (``epoch``, ``batch``, ...) as attributes of the state."""
    optimizer = optimizer if optimizer is not None else model.optimizer
    state = binding.active().elastic_state(model, optimizer, **kwargs)
    for name, value in (("model", model), ("optimizer", optimizer)):
        if not hasattr(state, name):
            setattr(state, name, value)
    return state


TensorFlowKerasState = KerasState


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commits the state every ``batches_per_commit`` batches and at each epoch's end."""

    def __init__(self, state: Any, batches_per_commit: int = 1):
        super().__init__()
        self.state, self.batches_per_commit = state, batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same on every rank after a reset

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keeps ``state.batch`` current, and after a reset runs only the epoch's remaining steps."""

    def __init__(self, state: Any):
        super().__init__()
        self.state, self.steps_per_epoch = state, None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(tf.keras.callbacks.Callback):
    """Keeps ``state.epoch`` the global epoch count, across resets."""

    def __init__(self, state: Any):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1
