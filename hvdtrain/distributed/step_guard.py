"""fit's train function, watched where ranks part ways inside a step, so that none waits alone.

Two things end a step on one rank while its peers sit in the step's all-reduce:
- a dataset of unknown length (``filter``, a generator) that runs out on one rank first: the
  rank that runs out joins (it answers its peers' all-reduces with zeros until each of them
  runs out too), then every rank shows the others its step count, and all stop with one line
  naming each rank's count if they differ. A call runs up to ``steps_per_execution`` steps,
  so two ranks can make as many calls and still part ways inside the last one: then the
  optimizer's step count is compared. Without this the rank with more batches would wait for
  the stall abort (10 minutes by default), or train a last step on its own;
- a variable with a gradient on some ranks only (a layer skipped by a Python ``if`` on one
  rank): the distributed optimizer's check of the missing places fails the step on every
  rank before any other collective of the update (reducer.MISSING_ON_SOME_RANKS; Horovod's
  mismatched shapes where a script reduces without it), and every rank stops with one line
  naming the first such variable (the optimizer records, as each step is traced, which
  variables had a gradient).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

# Horovod: every rank's step count and gradient layout, gathered as Python objects.
import horovod.tensorflow as hvd

from hvdtrain.distributed import collectives
from hvdtrain.distributed.reducer import MISSING_ON_SOME_RANKS
from hvdtrain.errors import UserError

LAYOUT = "hvdtrain_gradient_layout"  # on the optimizer: [(variable, has a gradient)] at trace


class GuardedSteps:
    """``train_function`` counting this epoch's calls, and catching where they end.
    ``unknown_length``: the data's length was unknown when fit began (with a known one,
    every rank was shown to run as many steps, and Keras stops each at that count)."""

    def __init__(self, train_function: Any, model: Any, unknown_length: bool):
        self.train_function, self.model, self.calls = train_function, model, 0
        self.first_step = 0
        self.watch(unknown_length)

    def watch(self, unknown_length: bool) -> None:
        """A fit begins: its count starts again; whether calls run several steps is read once
        (a step count is then compared, not calls)."""
        self.calls, self.unknown_length = 0, unknown_length
        self.several = unknown_length and steps_per_call(self.model) > 1

    def __call__(self, iterator: Any) -> Any:
        if self.calls == 0 and self.several:
            self.first_step = applied_steps(self.model)
        try:
            logs = self.train_function(iterator)
        except (StopIteration, tf.errors.OutOfRangeError):
            calls, self.calls = self.calls, 0
            if self.unknown_length:
                ran_out_together(applied_steps(self.model) - self.first_step
                                 if self.several else calls)
            raise
        except tf.errors.OpError as error:
            problem = (layout_problem(self.model) if "Mismatched" in str(error)
                       or MISSING_ON_SOME_RANKS in str(error) else None)
            if problem:
                raise UserError(problem, shared=True) from None
            raise
        self.calls += 1
        return logs


def guard_steps(model: Any, unknown_length: bool) -> None:
    """``model.train_function`` (made by fit before ``on_train_begin``) guarded, its count
    started again; a dataset of known length was checked before (``same_steps``)."""
    current = getattr(model, "train_function", None)
    if isinstance(current, GuardedSteps):
        current.watch(unknown_length)
    elif current is not None:
        model.train_function = GuardedSteps(current, model, unknown_length)


def steps_per_call(model: Any) -> int:
    """compile's ``steps_per_execution``: an int on Keras 3, a variable on Keras 2."""
    value = getattr(model, "steps_per_execution", None) or model._steps_per_execution
    return int(value.numpy() if hasattr(value, "numpy") else value)


def applied_steps(model: Any) -> int:
    """The optimizer's step count. Not read when a call is one step: Keras 3's count is not
    tied to the step's data, so the call where the data runs out may add one too."""
    return int(model.optimizer.iterations.numpy())


def ran_out_together(steps: int) -> None:
    """A collective of every rank whose data ran out: all raise the same UserError when the
    ranks ran different numbers of steps this epoch."""
    if hvd.size() == 1:  # Horovod: alone, no one waits
        return
    collectives.join()
    # Horovod: every rank's count, so that all ranks take the same branch.
    counts = hvd.allgather_object(steps, name="hvdtrain_step_counts")
    if len(set(counts)) == 1:
        return
    listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(counts))
    raise UserError(f"the ranks' data ran out after different numbers of steps in an epoch of "
                    f"fit ({listed}): a dataset of unknown length (filter, a generator) gave "
                    f"them different numbers of batches, so the rank with more would train "
                    f"alone; give every rank the same number of batches (pass "
                    f"steps_per_epoch, or take(n) on each rank's dataset)", shared=True)


def record_layout(optimizer: Any, gradients: list, variables: Any) -> None:
    """While a step is traced: which of the optimizer's variables got a gradient."""
    if variables is not None:  # a tuple, set around Keras' attribute tracking (which lists take)
        object.__setattr__(optimizer, LAYOUT, tuple((getattr(v, "path", v.name), g is not None)
                                                    for g, v in zip(gradients, variables)))


def layout_problem(model: Any) -> str | None:
    """A collective: the one line naming the first variable with a gradient on some ranks
    only, or None when every rank's last traced step had the same."""
    layout = getattr(getattr(model, "optimizer", None), LAYOUT, ())
    # Horovod: every rank's layout, so that all ranks name the same variable.
    layouts = hvd.allgather_object(layout, name="hvdtrain_gradient_layouts")
    for rank, other in enumerate(layouts[1:], start=1):
        for (name, mine), (_, theirs) in zip(layouts[0], other):
            if mine != theirs:
                has, lacks = (0, rank) if mine else (rank, 0)
                return (f"variable '{name}' has a gradient on rank {has} but none on rank "
                        f"{lacks}, so the ranks' all-reduces differ: a layer skipped on some "
                        f"ranks (a Python if on the rank or on the data); run the same layers "
                        f"on every rank (multiply a branch by 0 rather than skip it)")
    return None
