"""The learning rate formulas of Horovod's Keras callbacks, as Horovod 0.28.1 computes them
(``horovod/_keras/callbacks.py``): plain functions of the epoch, testable without Horovod."""
from __future__ import annotations

from typing import Callable


def exponential(multiplier: float, start_epoch: int) -> Callable[[float], float]:
    """A constant ``multiplier`` given to LearningRateScheduleCallback: exponential decay,
    ``multiplier ** (epoch - start_epoch)``."""
    return lambda epoch: multiplier ** (epoch - start_epoch)


def warmup(size: int, warmup_epochs: float, steps_per_epoch: int) -> Callable[[float], float]:
    """LearningRateWarmupCallback's multiplier: from 1/size of ``initial_lr`` (the scaled
    rate) at the first batch up to all of it after ``warmup_epochs``, linearly per batch;
    the epoch shifted by one batch so that each epoch ends on a round number."""
    def multiplier(epoch: float) -> float:
        epoch += 1.0 / steps_per_epoch
        return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)
    return multiplier


def adjusted_epoch(epoch: int, batch: int, *, start_epoch: int, end_epoch: int | None,
                   staircase: bool, steps_per_epoch: int | None) -> float | None:
    """The epoch (fractional unless ``staircase``) whose rate is set before ``batch`` of
    ``epoch``, or None where the callback leaves the rate alone: outside [start_epoch,
    end_epoch), and with ``staircase`` after each epoch's first batch."""
    if epoch < start_epoch or (end_epoch is not None and epoch >= end_epoch):
        return None
    if staircase:
        return float(epoch) if batch == 0 else None
    assert steps_per_epoch
    return epoch + float(batch) / steps_per_epoch


def steps_per_epoch(params: dict) -> int | None:
    """The steps per epoch fit's params give, as Horovod finds them, or None."""
    if params.get("steps"):
        return int(params["steps"])
    if params.get("samples") and params.get("batch_size"):
        return int(params["samples"]) // int(params["batch_size"])
    return None
