"""Rank 0's state on every rank, on either Keras: the broadcast that matches variables by
position, and the ``fit`` callback that runs it before the first step.

Horovod's own ``broadcast_variables`` names each broadcast after ``var.name``, which Keras numbers
per process (``dense_2/kernel`` on a rank that built one model more): the ranks then wait on
broadcasts that never pair up. Here the i-th variable of every rank's list is broadcast under
the name ``hvdtrain_broadcast_i``, after every rank has shown the same list of shapes and dtypes.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Sequence

import tensorflow as tf

# Horovod: plain collectives on tensors; no Keras inside.
import horovod.tensorflow as hvd

from hvdtrain.launch import rank_env
from hvdtrain.distributed.reducer import places_check, waiting_for
from hvdtrain.distributed.step_guard import guard_steps
from hvdtrain.distributed.world import controller
from hvdtrain.errors import UserError
from hvdtrain.distributed.watchdog import StallWatchdog


def broadcast_by_position(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    """``root_rank``'s values assigned to ``variables`` (TensorFlow variables) on every rank,
    the i-th to the i-th. Every rank raises the same UserError when the ranks' lists differ.
    Called while a tf.function is traced (Horovod's synthetic benchmark broadcasts inside its
    step), the broadcasts become ops of that graph, unchecked: the check gathers Python
    values, which a graph cannot (mismatched shapes then fail in Horovod's broadcast); each
    call's broadcasts get names of their own, as two calls' run together in one graph."""
    variables = list(variables)
    if not tf.executing_eagerly():
        _assign_broadcast(variables, root_rank, f"hvdtrain_broadcast_g{next(_IN_GRAPH)}")
        return
    layout = [(tuple(v.shape.as_list()), v.dtype.name) for v in variables]
    # Horovod: every rank's layout, so that all ranks see a mismatch and stop together.
    layouts = hvd.allgather_object(layout)
    for rank, other in enumerate(layouts):
        if other != layouts[root_rank]:
            raise UserError(_mismatch(layouts[root_rank], root_rank, other, rank), shared=True)
    if variables:
        _assign_broadcast(variables, root_rank)


_IN_GRAPH = itertools.count()  # the calls traced into graphs, in the same order on every rank


def _assign_broadcast(variables: list[tf.Variable], root_rank: int,
                      prefix: str = "hvdtrain_broadcast") -> None:
    @tf.function(autograph=False)
    def assign_all() -> None:
        for i, variable in enumerate(variables):
            # Horovod: one broadcast per variable, named by its position alone (no name scope,
            # which Keras numbers per process), all submitted at once inside this graph.
            variable.assign(hvd.broadcast(variable, root_rank, name=f"{prefix}_{i}",
                                          ignore_name_scope=True))
    assign_all()


def tf_variables(variables: Sequence[Any]) -> list[tf.Variable]:
    """The TensorFlow variables of ``variables``: a Keras 3 variable holds one in ``.value``
    (which a broadcast assigns in place); Keras 2's, and a script's own, are ones already."""
    return [v if isinstance(v, tf.Variable) else v.value for v in variables]


def broadcast_before_first_update(iterations: Any, variables: Sequence[Any],
                                  after: Any = None) -> None:
    """In a distributed optimizer's update, before it changes ``variables``: root's values of
    them on every rank when the optimizer's step count ``iterations`` is 0, nothing after.
    A script that never broadcast (a train_on_batch loop, a loop of its own) would otherwise
    average the gradients into different models, one per rank, silently; where the state was
    broadcast before the first step (fit_callbacks), the values are already equal. ``after``:
    an op (the reducer's places_check) that must pass first on every rank, or none."""
    if hvd.size() == 1:  # Horovod: alone, nothing to take; no broadcast in a 1-rank step
        return
    targets = tf_variables(variables)

    def broadcast() -> tf.Tensor:
        broadcast_by_position(targets, 0)
        return tf.constant(True)

    with tf.control_dependencies([] if after is None else [after]):
        first = tf.equal(iterations, 0)
    tf.cond(first, broadcast, lambda: tf.constant(False))


def before_update(gradients: Sequence[Any], iterations: Any,
                  variables: Sequence[Any]) -> list[Any]:
    """What a distributed optimizer's update does before it reduces and applies ``gradients``
    (for ``variables``), on either Keras: the check that every rank misses the same ones
    (reducer.places_check), then root's values before the first update (which waits for the
    check, as the returned gradients do: a collective started on some ranks only would be left
    waiting when the check fails the step)."""
    check = places_check(gradients, "hvdtrain_update")
    broadcast_before_first_update(iterations, variables, after=check)
    return waiting_for(check, gradients)


SEED_STRIDE = 1_000_003  # a prime: rank r's seeds lie far from any seed a user picks nearby


def seed_offset(root_rank: int) -> int:
    """What this rank adds to the seed a broadcast copied from ``root_rank``, so that its
    random layers draw their own numbers: ``(rank - root) * SEED_STRIDE``, distinct per rank,
    0 on root, the same for a given world size (each binding applies it to its own seeds)."""
    # Horovod: this process's place in the job picks its own random stream.
    return (hvd.rank() - root_rank) * SEED_STRIDE


def _mismatch(root: list, root_rank: int, other: list, rank: int) -> str:
    if len(root) != len(other):
        return (f"the ranks broadcast different models: rank {root_rank} has {len(root)} "
                f"variables, rank {rank} {len(other)}: build the same model and optimizer on "
                f"every rank")
    i = next(i for i, (a, b) in enumerate(zip(root, other)) if a != b)
    return (f"the ranks broadcast different models: variable {i} is {root[i][0]} {root[i][1]} "
            f"on rank {root_rank} but {other[i][0]} {other[i][1]} on rank {rank}: build the "
            f"same model and optimizer on every rank")


class BroadcastInitialState(tf.keras.callbacks.Callback):
    """Rank 0's weights and optimizer state on every rank, before the first step, on either
    Keras; and the checks that keep ``fit`` from hanging or training apart.

    Neither Keras builds the optimizer's slots before the first step, nor a model without an
    ``Input``. A model that has its weights when training begins: the optimizer is built here
    and both are broadcast at once. A model still without weights: the first call of the train
    function builds it from the batches' spec first, then broadcasts, then runs the step.
    Either way N ranks at batch B train exactly as 1 rank at N x B, a state restored on rank 0
    alone included. Where the model cannot be built from the spec, the broadcast follows the
    first step, as Horovod's own Keras callback does: the ranks agree from the second step on.

    ``binding`` is the Keras binding module (``binding.py``): its optimizer building, model
    building, variables and checks differ between Keras 2 and 3."""

    def __init__(self, binding: Any, root_rank: int = 0):
        super().__init__()
        self.binding, self.root_rank = binding, root_rank
        self.done = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        if getattr(self.model, "jit_compile", False):
            raise UserError("this model is compiled with XLA (jit_compile=True; Keras 3 turns it "
                            "on by itself when it sees a GPU), but Horovod's all-reduce has no "
                            "XLA lowering: compile with jit_compile=False")
        self.binding.check_fit_start(self.model)
        steps = self.params.get("steps")
        same_steps(steps)
        guard_steps(self.model, steps is None)  # before the first step's wrapper (it puts it back)
        if self.done:
            return
        if self.model.built and self.model.variables:
            self._build_optimizer_and_broadcast()
        else:
            self._build_and_broadcast_at_first_step()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self.done:
            self._broadcast()
        self.binding.check_first_step(self.model)

    def _build_optimizer_and_broadcast(self) -> None:
        self.binding.build_optimizer(self.model.optimizer, self.model.trainable_variables)
        self._broadcast()

    def _build_and_broadcast_at_first_step(self) -> None:
        """Wraps the model's train function (made before on_train_begin) for its first call."""
        model = self.model
        train_function = getattr(model, "train_function", None)
        if train_function is None:
            return

        def first_step(iterator: Any) -> Any:
            model.train_function = train_function
            spec = getattr(iterator, "element_spec", None)
            if spec is not None and not self.done:
                self.binding.build_model(model, spec)
                if model.variables:
                    self._build_optimizer_and_broadcast()
            return train_function(iterator)

        model.train_function = first_step

    def _broadcast(self) -> None:
        self.binding.broadcast_variables(
            [*self.model.variables, *self.binding.optimizer_variables(self.model.optimizer)],
            self.root_rank)
        self.done = True


def same_steps(steps: int | None) -> None:
    """Every rank raises the same UserError when the ranks would run different numbers of
    steps: the rank with more batches would wait forever in an all-reduce its peers never
    join. ``steps`` None (a dataset of unknown length) is checked where a rank runs out
    (``step_guard.py``)."""
    # Horovod: every rank's step count, so that all ranks take the same branch.
    counts = hvd.allgather_object(steps)
    if None in counts or len(set(counts)) == 1:
        return
    listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(counts))
    raise UserError(f"the ranks would run different numbers of steps per epoch in fit "
                    f"({listed}), and the rank with more batches would wait forever for the "
                    f"others' all-reduce: give every rank the same number of batches (shard "
                    f"equal parts, batch with drop_remainder=True, or pass steps_per_epoch)",
                    shared=True)


def stall_watchdog() -> StallWatchdog | None:
    """For a library user's ``fit`` under Gloo, where Horovod's own stall check does nothing:
    a watchdog that ends this rank when no step finished for the stall abort's seconds (as
    ``dist.init(stall_abort_s=...)`` set it), so that a rank stuck in a collective (a peer with
    fewer batches of unknown count, a peer that died quietly) cannot hang the job."""
    seconds = rank_env.stall_abort_in_force(os.environ)
    # Horovod: under MPI its own stall check ends the job after those seconds; alone, no wait.
    if hvd.size() == 1 or controller() == "mpi" or not seconds:
        return None
    return StallWatchdog(seconds, hvd.rank(), setting="dist.init(stall_abort_s=...)")
