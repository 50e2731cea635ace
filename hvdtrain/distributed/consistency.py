"""The check that ranks which drift apart never stay silent, whatever the cause.

Data-parallel training is right only while every rank holds the same model and reads its own
part of the data. Scripts break that in more ways than any list of patterns holds (an optimizer
never made distributed, a callback on rank 0 alone, weights restored on one rank, the whole
data set on every rank), and the ranks then train apart with no error. So at fixed points every
rank compares cheap checksums with the others', and all stop together with one line naming the
first thing that differs and its likely cause:

- the first batch of a ``fit``: the same on every rank means the data was not sharded;
- after the first step: the trainable variables must still agree (the gradients were reduced);
- before each epoch's first step: every rank at the same epoch (a restore or ``initial_epoch``
  on some ranks only), and the learning rate rank 0's (one a callback changed on rank 0 alone
  is taken by every rank; another hyperparameter that differs stops the job);
- before a validation inside ``fit``: every rank validates (``validation_data`` on some ranks
  only would leave the others waiting in a collective);
- at the first epoch's end, at the end of training, and at the epoch ends between as often as
  ``check_cadence.py`` finds cheap (every epoch's end once epochs are long): every trainable
  variable and hyperparameter.

Its cost: a hash of each batch's inputs during the first epoch of a ``fit``, one small
all-gather at each epoch's start, and passes over the weights: together at most
``check_cadence.SHARE`` of the training time. Off:
``dist.fit_callbacks(consistency_check=False)``, ``--set train.consistency_check=false``.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

# Horovod: every rank's checksums gathered as Python objects.
import horovod.tensorflow as hvd

from hvdtrain.distributed.batch_record import BatchRecord, batch_record
from hvdtrain.distributed.check_cadence import Cadence
from hvdtrain.distributed.divergence import (OFF, UNREDUCED, UNSHARDED, Snapshot,
                                             difference_problem, differing_hyperparameters,
                                             phase_problem, repeated_problem, same_batches,
                                             variable_difference)
from hvdtrain.errors import UserError


def checksums(variables: Sequence[Any]) -> np.ndarray:
    """[sum, sum of squares] of each variable, in float64: equal on ranks that agree."""
    out = np.zeros((len(variables), 2))
    for i, variable in enumerate(variables):
        values = np.asarray(variable.numpy(), np.float64).ravel()
        out[i] = values.sum(), values @ values
    return out


def _optimizers(optimizer: Any) -> list[tuple[str, Any]]:
    """The optimizer and, for a loss scale optimizer, the one it wraps, with name prefixes."""
    inner = getattr(optimizer, "inner_optimizer", None)
    return [("", optimizer)] + ([("inner.", inner)] if inner is not None else [])


def learning_rate(optimizer: Any) -> float:
    """The learning rate the optimizer's next step uses (a schedule's at its step count)."""
    rate = optimizer.learning_rate
    if callable(rate) and not hasattr(rate, "assign"):  # a schedule object
        rate = rate(optimizer.iterations)
    return float(np.asarray(rate))


def hyperparameters(optimizer: Any) -> dict[str, float]:
    """The optimizer's numeric hyperparameters (its config's numbers, the current learning
    rate); {} for none."""
    if optimizer is None:
        return {}
    out: dict[str, float] = {}
    for prefix, each in _optimizers(optimizer):
        for name, value in each.get_config().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[prefix + name] = float(value)
        if hasattr(each, "learning_rate"):
            out[prefix + "learning_rate"] = learning_rate(each)
    return out


def gather(snapshot: Snapshot) -> list[Snapshot]:
    # Horovod: every rank's snapshot, so that all ranks see the same difference and stop
    # together. One name at every check point: ranks at different points still pair up.
    return hvd.allgather_object(snapshot, name="hvdtrain_consistency")


def snapshot(phase: tuple, variables: Sequence[Any] = (), optimizer: Any = None,
             batch: tuple[float, ...] = (), samples: tuple[int, ...] = (),
             due: bool = True) -> Snapshot:
    return Snapshot(phase, tuple(getattr(v, "path", v.name) for v in variables),
                    checksums(variables), hyperparameters(optimizer), batch, samples, due)


def compare(phase: tuple, when: str, variables: Sequence[Any], optimizer: Any,
            samples: tuple[int, ...] = (), *, repeated_stops: bool = True) -> None:
    """A collective: every rank raises the same UserError when the ranks are at different
    check points, trained mostly the same ``samples`` (a MinHash signature; unless
    ``repeated_stops`` is off: then rank 0 says so in one line), or their ``variables`` or
    ``optimizer``'s hyperparameters differ."""
    snapshots = gather(snapshot(phase, variables, optimizer, samples=samples))
    repeated = repeated_problem(snapshots)
    if repeated and not repeated_stops:
        say(f"{repeated.split(': ', 1)[0]}; Horovod's scripts may draw each rank's batches "
            f"from the whole data set, but shards give each rank its own: "
            f"dataset.shard(hvd.size(), hvd.rank()) before shuffle and batch")
        repeated = None
    problem = phase_problem(snapshots) or repeated or difference_problem(snapshots, when)
    if problem:
        raise UserError(problem, shared=True)


def check_consistency(variables: Sequence[Any], optimizer: Any = None, *,
                      when: str = "now") -> None:
    """A collective: every rank raises the same UserError when the ranks' ``variables``
    (trainable ones) or ``optimizer``'s hyperparameters differ, naming the first that does.
    For a loop of your own (``dist.distributed_tape``): call it on every rank at each epoch's
    end; ``fit_callbacks()`` and hvdtrain's trainer do it for you."""
    if hvd.size() > 1:  # Horovod: one rank has no one to differ from
        compare(("check", when), when, variables, optimizer)


def is_distributed(optimizer: Any) -> bool:
    """True for an optimizer whose update all-reduces the gradients (hvdtrain's, Horovod's),
    or a loss scale optimizer around one."""
    while optimizer is not None:
        # Horovod: its own Keras 2 DistributedOptimizer has _allreduce.
        if getattr(optimizer, "hvdtrain_distributed", False) or hasattr(optimizer, "_allreduce"):
            return True
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return False


def plain_optimizer_problem(model: Any) -> str | None:
    """Why fit would train each rank on its own gradients, or None: Keras' own train_step
    reduces through the optimizer alone (an own train_step may use dist.distributed_tape)."""
    optimizer = getattr(model, "optimizer", None)
    if (optimizer is None or is_distributed(optimizer)
            or type(model).train_step is not tf.keras.Model.train_step):
        return None
    return (f"the model's optimizer ({type(optimizer).__name__}) is not distributed, so every "
            f"rank would train on its own gradients: compile with "
            f"dist.distributed_optimizer(optimizer) (hvd.DistributedOptimizer(optimizer) in a "
            f"Horovod script; optimizer='adam' makes a plain one; a loaded model: "
            f"model.compile(dist.distributed_optimizer(model.optimizer), ...))")


class ConsistencyCheck(tf.keras.callbacks.Callback):
    """The check points of this module's docstring, for ``fit`` (``fit_callbacks()`` and the
    trainer) and for hvdtrain's custom loop, which drives the same callbacks. Put it first:
    it must see each epoch before other callbacks change the optimizer. ``optimizer``: the
    one the loop steps (the custom loop's; else the model's). ``broadcast``: the callback
    that broadcasts rank 0's state (its ``done`` says whether the first step began from it);
    None where the state was broadcast before training. ``repeated_samples_stop`` off: ranks
    whose first epoch drew mostly the same samples are told so, not stopped (Horovod's
    scripts draw each rank's batches from the whole data set, scaling the steps instead)."""

    def __init__(self, *, optimizer: Any = None, broadcast: Any = None,
                 repeated_samples_stop: bool = True):
        super().__init__()
        self._optimizer, self.broadcast = optimizer, broadcast
        self.repeated_samples_stop = repeated_samples_stop
        self.epoch, self.first_step, self.first_epoch, self.training = 0, True, True, False
        self.record: BatchRecord | None = None
        self.cadence, self.due, self.fresh, self.epoch_began = Cadence(), True, False, 0.0

    @property
    def optimizer(self) -> Any:
        return self._optimizer or getattr(self.model, "optimizer", None)

    def _active(self) -> bool:
        return hvd.size() > 1  # Horovod: one rank has no one to differ from

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.first_step, self.first_epoch, self.record = True, True, None
        self.training = True
        if not self._active() or getattr(self.model, "train_function", None) is None:
            return  # the custom loop: its own step, with a plain optimizer
        # Horovod: every rank's verdict, so that all stop together.
        problems = hvd.allgather_object(plain_optimizer_problem(self.model),
                                        name="hvdtrain_consistency")
        if any(problems):
            raise UserError(next(p for p in problems if p), shared=True)
        self.record = batch_record(self.model)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch, self.epoch_began = epoch, time.monotonic()

    def on_test_begin(self, logs: dict | None = None) -> None:
        if self.training and self._active():  # fit's validation, not an evaluate() of one's own
            problem = phase_problem(gather(Snapshot(("validation", self.epoch))))
            if problem:
                raise UserError(problem, shared=True)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if batch != 0 or not self._active():
            return
        began = time.monotonic()
        snapshots = gather(snapshot(("epoch", self.epoch), (), self.optimizer,
                                    due=self.cadence.due(began)))
        problem = phase_problem(snapshots)
        if problem:
            raise UserError(problem, shared=True)
        self.due = snapshots[0].due   # rank 0's clock decides for every rank
        take_root_learning_rate(self.optimizer, snapshots, self.epoch)
        self.cadence.started(time.monotonic() - began)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.fresh = False
        if not self.first_step or not self._active():
            return
        self.first_step = False
        batch_sums = self.record.first_batch() if self.record else ()
        began_alike = self.broadcast is None or self.broadcast.done
        snapshots = gather(snapshot(
            ("first step",), self.model.trainable_variables if began_alike else (), None,
            batch_sums))
        if batch_sums and same_batches([s.batch for s in snapshots]):
            raise UserError(f"every rank trained the same first batch: {UNSHARDED}", shared=True)
        found = variable_difference(snapshots)
        if found:
            raise UserError(f"the first step left the ranks' models apart (variable "
                            f"'{snapshots[0].names[max(found[1], 0)]}' differs on rank "
                            f"{found[0]}): {UNREDUCED}; {OFF}", shared=True)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self._active():
            return
        began = time.monotonic()
        self.cadence.epoch_ended(began - self.epoch_began)
        if not (self.due or self.first_epoch):
            return
        samples = self.record.first_epoch() if self.record and self.first_epoch else ()
        self.first_epoch = False
        compare(("epoch end", epoch), f"after epoch {epoch + 1}",
                self.model.trainable_variables, self.optimizer, samples,
                repeated_stops=self.repeated_samples_stop)
        self.cadence.checked(began, time.monotonic())
        self.fresh = True

    def on_train_end(self, logs: dict | None = None) -> None:
        self.training = False
        if self._active():   # the weights again unless no step ran since they were compared
            compare(("end",), "at the end of training",
                    () if self.fresh else self.model.trainable_variables, self.optimizer)


def take_root_learning_rate(optimizer: Any, snapshots: list[Snapshot], epoch: int) -> None:
    """Before an epoch's first step: a learning rate that differs from rank 0's (a callback on
    rank 0 alone changed it, as users write ReduceLROnPlateau under ``if rank == 0``) becomes
    rank 0's on every rank; any other hyperparameter that differs stops every rank."""
    differing = differing_hyperparameters(snapshots)
    if not differing:
        return
    rates = {"learning_rate", "inner.learning_rate"}
    rate = getattr(optimizer, "learning_rate", None)
    if differing - rates or rate is None or not hasattr(rate, "assign"):
        raise UserError(difference_problem(snapshots, f"before epoch {epoch + 1}") or "",
                        shared=True)
    root = snapshots[0].hyperparameters["learning_rate"]
    others = ", ".join(f"{s.hyperparameters.get('learning_rate', float('nan')):g} on rank {r}"
                       for r, s in enumerate(snapshots) if r)
    rate.assign(root)
    say(f"the learning rate was {root:g} on rank 0, {others} before epoch {epoch + 1} (a "
        f"callback on some ranks only?): every rank now uses rank 0's")


def say(line: str) -> None:
    # Horovod: rank 0 alone prints.
    if hvd.rank() == 0:
        print(f"hvdtrain: {line}", file=sys.stderr, flush=True)
