"""The Keras 2 binding (tf.keras in TensorFlow 2.15): Horovod's own Keras layer.

Everything here depends on which Keras is installed; ``hvdtrain.distributed`` picks this module when
``tf.keras`` is Keras 2 and calls it through the functions listed in its ``KerasBinding``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import tensorflow as tf

# Horovod: plain collectives on tensors.
import horovod.tensorflow as hvd
# Horovod: the Keras 2 wrapper: DistributedOptimizer, callbacks and elastic state.
import horovod.tensorflow.keras as hvd_keras

from hvdtrain.config import HorovodConfig, capabilities
from hvdtrain.distributed.broadcast import before_update, broadcast_by_position, seed_offset
from hvdtrain.distributed.reducer import reduce_gradients, refuse_reduced
from hvdtrain.distributed.step_guard import record_layout
from hvdtrain.errors import UserError

CAPABILITIES = capabilities.KERAS2  # what this binding runs, and why not where it does not


def distributed_optimizer(optimizer: tf.keras.optimizers.Optimizer, options: HorovodConfig,
                          *, average_aggregated: bool = True) -> tf.keras.optimizers.Optimizer:
    """Horovod's DistributedOptimizer around ``optimizer``, all-reducing through hvdtrain's
    reducer (``options``: compression, op, sparse_as_dense, buckets), refusing gradients a
    distributed tape reduced already, with what was set on ``optimizer`` outside its config."""
    # Horovod: its optimizer's flow around every update (k batches' gradients accumulated
    # locally first, averaged or summed, if asked); the all-reduce itself is hvdtrain's.
    distributed = hvd_keras.DistributedOptimizer(
        optimizer, backward_passes_per_step=options.backward_passes_per_step,
        average_aggregated_gradients=average_aggregated)
    # Horovod rebuilds the optimizer from its config: what the user set outside it (AdamW's
    # exclude_from_weight_decay, say) is carried over, or it would be silently lost. What its
    # build() made (slots, the built flag) is not: the copy builds its own, then takes the
    # values (a loaded model's optimizer state), in build_optimizer.
    for name, value in vars(optimizer).items():
        if (name not in vars(distributed) and not name.startswith("_self_")
                and not _built_state(name, value)):
            setattr(distributed, name, value)
    if _variables(optimizer):
        distributed.hvdtrain_state_from = optimizer
    distributed.hvdtrain_distributed = True  # the consistency check asks
    _reduce_with_hvdtrain(distributed, options)
    _reduce_exactly_once(distributed)
    return distributed


def _reduce_with_hvdtrain(distributed: Any, options: HorovodConfig) -> None:
    """Horovod's optimizer keeps its flow (which gradients, when, accumulation over backward
    passes), but what all-reduces them is hvdtrain's reducer, as on Keras 3: one flat tensor,
    so a variable with a gradient on some ranks only fails at once, named by step_guard.py,
    where Horovod's per-tensor all-reduces would wait for a tensor one rank never sends."""
    def reduce(grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        grads = list(grads)
        record_layout(distributed, grads, list(variables))
        grads = before_update(grads, distributed.iterations, list(variables))
        return reduce_gradients(grads, options)

    # Horovod: its _allreduce (and the accumulation helper, which took the function when it
    # was made) calls _allreduce_grads on the gradients to reduce.
    distributed._allreduce_grads = reduce
    helper = getattr(distributed, "_agg_helper", None)
    for name in ("_allreduce_grads", "allreduce_grads"):  # the graph and the eager helper
        if hasattr(helper, name):
            setattr(helper, name, reduce)


def _built_state(name: str, value: Any) -> bool:
    """An attribute an optimizer's build() made: the built flag, or its slot variables."""
    values = value.values() if isinstance(value, dict) else value
    return name == "_built" or (isinstance(values, (list, tuple)) and any(
        isinstance(item, tf.Variable) for item in values))


def _variables(optimizer: Any) -> list[tf.Variable]:
    """An optimizer's variables beyond its step count: its state once built."""
    variables = optimizer_variables(optimizer)
    return variables if len(variables) > 1 else []


def _reduce_exactly_once(distributed: Any) -> None:
    """Horovod's optimizer reduces inside ``compute_gradients`` (which ``minimize``, and so
    Keras 2's own ``train_step``, calls), not in ``apply_gradients``: gradients from a custom
    ``train_step`` (a tape, then ``apply_gradients``) would be applied unreduced, each rank
    its own. Here ``apply_gradients`` reduces what ``compute_gradients`` did not just reduce
    for the same variables, and refuses what a distributed tape reduced."""
    compute, apply_gradients = distributed._compute_gradients, distributed.apply_gradients
    reduced_for: list[int] = []  # the variables whose gradients compute_gradients just reduced

    def computing(loss, var_list, grad_loss=None, tape=None):
        grads_and_vars = compute(loss, var_list, grad_loss, tape)
        reduced_for[:] = [id(variable) for _, variable in grads_and_vars]
        return grads_and_vars

    def applying(grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [grad for grad, _ in grads_and_vars]
        variables = [variable for _, variable in grads_and_vars]
        refuse_reduced(grads)
        reduced = reduced_for == [id(variable) for variable in variables]
        reduced_for.clear()
        if not reduced:
            # Horovod: the optimizer's flow, reducing through hvdtrain's reducer.
            grads = distributed._allreduce(grads, variables)
        return apply_gradients(list(zip(grads, variables)), *args, **kwargs)

    def reducing(grads, variables):
        """The gradients reduced now, and recorded so that the next apply does not again."""
        # Horovod: the optimizer's flow, reducing through hvdtrain's reducer.
        grads = distributed._allreduce(list(grads), list(variables))
        reduced_for[:] = [id(variable) for variable in variables]
        return grads

    # Horovod: its compute_gradients calls self._compute_gradients, as legacy minimize does.
    distributed._compute_gradients = computing
    distributed.apply_gradients = applying
    distributed.hvdtrain_reduce = reducing
    distributed.hvdtrain_reduced_for = reduced_for


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    broadcast_by_position(variables, root_rank)  # by position: see broadcast.py
    draw_own_random_numbers(root_rank)


# What this rank adds to the seeds of Keras' random layers, once a broadcast set it.
_SEED_OFFSET = {"value": 0}


def draw_own_random_numbers(root_rank: int) -> None:
    """Each rank's random layers (Dropout, noise, augmentation) draw their own numbers. Keras 2
    seeds them from TensorFlow's global seed, so ranks seeded alike (as the trainer and
    tf.keras.utils.set_random_seed users do) would give sample i of every rank's batch the same
    dropout mask. The global seed itself stays the user's: unseeded tf.data shuffles read it,
    and a shuffle-then-shard pipeline needs the same order on every rank. Instead each seed a
    random layer draws gets ``seed_offset`` added: distinct on every rank, the same for a
    given seed and world size; unseeded, the layers draw per process already."""
    _SEED_OFFSET["value"] = seed_offset(root_rank)
    _offset_layer_seeds()


def _offset_layer_seeds() -> None:
    from keras.src import backend  # type: ignore[import-untyped]  # Keras 2.15's RandomGenerator
    from tensorflow.python.framework import random_seed  # the seed an unseeded op would take
    generator = backend.RandomGenerator
    if getattr(generator.make_legacy_seed, "hvdtrain_offset", False):
        return
    legacy, stateless = generator.make_legacy_seed, generator.make_seed_for_stateless_op

    def make_legacy_seed(self: Any) -> int | None:
        seed, offset = legacy(self), _SEED_OFFSET["value"]
        if offset and seed is None:
            global_seed, seed = random_seed.get_seed(None)  # the op seed TF would pick
            if global_seed is None:
                return None  # unseeded: every process draws its own
        return seed if seed is None or not offset else seed + offset

    def make_seed_for_stateless_op(self: Any) -> Any:
        seed = stateless(self)  # [seed, 0] for a stateless layer; a generator's draws are its own
        if not isinstance(seed, list) or not _SEED_OFFSET["value"]:
            return seed
        return [seed[0] + _SEED_OFFSET["value"], *seed[1:]]

    make_legacy_seed.hvdtrain_offset = True  # type: ignore[attr-defined]
    generator.make_legacy_seed = make_legacy_seed
    generator.make_seed_for_stateless_op = make_seed_for_stateless_op


def build_optimizer(optimizer: tf.keras.optimizers.Optimizer,
                    variables: Sequence[tf.Variable]) -> None:
    if hasattr(optimizer, "_create_all_weights"):  # a legacy (optimizer_v2) optimizer
        optimizer._create_all_weights(variables)
    else:
        optimizer.build(variables)
    source = getattr(optimizer, "hvdtrain_state_from", None)
    if source is not None:  # the state of the optimizer Horovod's copy was made from
        del optimizer.hvdtrain_state_from
        old, new = _variables(source), optimizer_variables(optimizer)
        if [v.shape for v in old] != [v.shape for v in new]:
            raise UserError(f"the optimizer given to distributed_optimizer() holds state for "
                            f"{len(old)} variables of other shapes than this model's "
                            f"{len(new)}: wrap the optimizer of the model you train")
        for target, value in zip(new, old):
            target.assign(value)


def build_model(model: tf.keras.Model, spec: Any) -> None:
    inputs = spec[0] if isinstance(spec, tuple) else spec
    try:
        model.build(tf.nest.map_structure(lambda s: s.shape, inputs))
    except (ValueError, TypeError, NotImplementedError):
        pass  # a model Keras 2 cannot build from shapes: the broadcast follows the first step


def check_fit_start(model: tf.keras.Model) -> None:
    pass  # Keras 2's compile puts a loss scale optimizer outside: Horovod's reduces inside it


def check_first_step(model: tf.keras.Model) -> None:
    pass  # Horovod's optimizer is a rebuilt copy: no train function can predate it


def optimizer_variables(optimizer: tf.keras.optimizers.Optimizer) -> list[tf.Variable]:
    return list(optimizer.variables())  # a method in Keras 2


def metric_average_callback() -> tf.keras.callbacks.Callback:
    # Horovod: the epoch's train metrics become the mean over ranks before anyone logs them.
    return hvd_keras.callbacks.MetricAverageCallback()


def elastic_state(model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                  **values: Any) -> Any:
    # Horovod: what elastic training commits in memory and syncs to new workers: weights,
    # optimizer slots and plain values (the epoch, the run directory).
    return hvd_keras.elastic.KerasState(model, optimizer=optimizer, **values)


def save_model(model: tf.keras.Model, path: Path) -> None:
    # Keras 2 writes a TensorFlow SavedModel directory (tf.keras.models.load_model reads it).
    model.save(str(path), include_optimizer=False, save_format="tf")


def load_model(folder: Path) -> tf.keras.Model:
    # Keras 2 reads the SavedModel directory back; no optimizer is needed to predict.
    return tf.keras.models.load_model(str(folder), compile=False)


def scale_loss(optimizer: tf.keras.optimizers.Optimizer, loss: tf.Tensor) -> tf.Tensor:
    return optimizer.get_scaled_loss(loss)  # Keras 2's LossScaleOptimizer


def unscale_gradients(optimizer: tf.keras.optimizers.Optimizer,
                      gradients: list[tf.Tensor]) -> list[tf.Tensor]:
    # Outside the seam's Protocol: Keras 3's table refuses it (binding.UnscalingBinding).
    return optimizer.get_unscaled_gradients(gradients)


def apply_scaled_gradients(optimizer: tf.keras.optimizers.Optimizer, gradients: list[tf.Tensor],
                           variables: Sequence[tf.Variable]) -> None:
    """The scaled gradients reduced first (where the loss scale optimizer wraps a distributed
    one), then unscaled and applied: the loss scale optimizer checks them for inf/NaN and
    applies its inner optimizer's update only where they are finite, so it must check the
    reduced gradients, the same on every rank. Checking each rank's own, a rank that
    overflowed would skip the all-reduce its peers wait in."""
    inner: Any = getattr(optimizer, "inner_optimizer", None)
    reduce = getattr(inner, "hvdtrain_reduce", None)
    if reduce is not None:
        gradients = reduce(gradients, variables)
    # Keras 2's LossScaleOptimizer applies what it is given: unscale first.
    optimizer.apply_gradients(zip(unscale_gradients(optimizer, gradients), variables))
    if reduce is not None:
        inner.hvdtrain_reduced_for.clear()  # a skipped step left the record unread


def sync_batch_normalization_class() -> type:
    # Horovod: its Keras 2 layer all-reduces each training step's moments over the ranks.
    return hvd.SyncBatchNormalization
