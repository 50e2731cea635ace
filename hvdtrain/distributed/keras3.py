"""The Keras 3 binding (TensorFlow 2.16 and later): hvdtrain's own, on Horovod's plain collectives.

Horovod's Keras layer cannot serve Keras 3: ``horovod.tensorflow.keras`` needs backend functions
Keras 3 removed, its tape and wrapper key dicts on ``var.ref()``, which Keras 3 variables lack,
and its DistributedOptimizer hooks methods that Keras 3's ``train_step`` never calls, so even
where it imports it would not reduce anything. Here the optimizer's ``apply`` (which
``apply_gradients`` and ``fit`` go through) all-reduces the gradients first, as one flat
tensor per step (``reducer.py``); everything else is built on ``horovod.tensorflow``'s
collectives, which work on plain tensors whatever the Keras version.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

# Horovod: plain collectives on tensors; no Keras inside.
import horovod.tensorflow as hvd
# Horovod: the elastic state base class that syncs plain Python values from rank 0.
from horovod.common.elastic import ObjectState

from hvdtrain.config import HorovodConfig, capabilities
from hvdtrain.distributed import broadcast
from hvdtrain.distributed.reducer import reduce_gradients, refuse_reduced
from hvdtrain.distributed.step_guard import record_layout
from hvdtrain.errors import UserError

CAPABILITIES = capabilities.KERAS3  # what this binding runs, and why not where it does not
MODEL_FILE = "model.keras"
SEED_STATE = "seed_generator_state"  # the variable name of Keras 3's SeedGenerator state


def distributed_optimizer(optimizer: tf.keras.optimizers.Optimizer, options: HorovodConfig,
                          *, average_aggregated: bool = True) -> tf.keras.optimizers.Optimizer:
    """``optimizer`` itself, made distributed: its ``apply`` all-reduces the gradients before
    updating (the first update from rank 0's variables). Wrap it before ``compile``; an
    optimizer with state already (a loaded model's) keeps it, and ``fit_callbacks()``
    broadcasts rank 0's.

    Under mixed_float16 the optimizer must be a LossScaleOptimizer when it is wrapped (this
    function makes it one), so that the SCALED gradients are reduced before it unscales them
    and checks them for inf/NaN: every rank then skips or applies the same steps. (Keras 3's
    compile would otherwise wrap it in a LossScaleOptimizer that checks before the all-reduce.)

    With ``options.backward_passes_per_step`` k > 1 (or Keras' own
    ``gradient_accumulation_steps``), Keras accumulates k batches' gradients (averaged; summed
    unless ``average_aggregated``, as Horovod's option says) and the all-reduce runs once, at
    the update."""
    if getattr(optimizer, "hvdtrain_distributed", False):
        return optimizer
    steps = _accumulation_steps(optimizer, options.backward_passes_per_step)
    optimizer = _loss_scaled(optimizer, steps)
    distributed = _distributed_class(type(optimizer), options, steps,
                                     1.0 if average_aggregated else float(steps))
    # The instance's class swapped rather than a copy rebuilt from get_config(): what the user
    # set outside the config (exclude_from_weight_decay, say) would be lost by a rebuild.
    optimizer.__class__ = distributed
    # A built optimizer may have stepped in a train function traced before this: check_first_step.
    optimizer.hvdtrain_wrapped_built = optimizer.built
    return optimizer


def _loss_scaled(optimizer: Any, steps: int) -> Any:
    """Under mixed_float16, ``optimizer`` as a LossScaleOptimizer (see distributed_optimizer)."""
    if (tf.keras.mixed_precision.global_policy().name == "mixed_float16"
            and not isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)):
        if steps > 1:
            raise UserError("gradient accumulation (backward_passes_per_step) under the "
                            "mixed_float16 policy is not offered: accumulate in float32")
        return tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def _distributed_class(base: type, options: HorovodConfig, steps: int, scale: float) -> type:
    """``base`` with its update all-reduced first: at every step, or with ``steps`` > 1 at the
    update only, the accumulated gradients multiplied by ``scale``."""
    def apply(self, grads, trainable_variables=None):
        # Horovod: average the gradients across ranks before the wrapped optimizer (and a
        # LossScaleOptimizer's unscaling and finiteness check) sees them; with accumulation,
        # at the update step only (``_clip_gradients``).
        grads, variables = list(grads), trainable_variables or self._trainable_variables
        refuse_reduced(grads)
        record_layout(self, grads, variables)
        self.hvdtrain_applied = True  # set while the train step is traced: see check_first_step
        # Every rank has the same gradients missing (a layer skipped on one would leave the
        # ranks' all-reduces apart), checked before any collective of the update starts; with
        # accumulation every step, as Keras drops the missing ones before _clip_gradients.
        grads = broadcast.before_update(grads, self.iterations, variables)
        if steps == 1:
            grads = reduce_gradients(grads, options)
        return base.apply(self, grads, trainable_variables)

    def clip_gradients(self, grads):
        # Horovod: Keras calls this once per update, on the accumulated gradients.
        grads = reduce_gradients(list(grads), options, name="hvdtrain_accumulated")
        if scale != 1.0:
            grads = [None if g is None else g * scale for g in grads]
        return base._clip_gradients(self, grads)

    methods: dict[str, Any] = {"apply": apply}
    if steps > 1:
        methods["_clip_gradients"] = clip_gradients
    # Same name and module as the wrapped class: a saved model's optimizer loads back as the
    # plain optimizer, without hvdtrain.
    return type(base.__name__, (base,), {
        **methods, "hvdtrain_distributed": True,
        "__module__": base.__module__, "__qualname__": base.__qualname__})


def _accumulation_steps(optimizer: tf.keras.optimizers.Optimizer, passes: int) -> int:
    """The batches per update: ``passes`` set on Keras' own accumulation, which builds its
    accumulators with the optimizer, so it must not be built yet."""
    own = optimizer.gradient_accumulation_steps or 1
    if passes > 1 and own > 1 and own != passes:
        raise UserError(f"backward_passes_per_step={passes} and the optimizer's "
                        f"gradient_accumulation_steps={own} disagree: set one of them")
    if passes > 1 and own == 1:
        if optimizer.built:
            raise UserError("backward_passes_per_step > 1 needs an optimizer without state "
                            "yet (its accumulators are made when it is built): wrap a fresh "
                            "optimizer")
        optimizer.gradient_accumulation_steps = passes
    return max(passes, own)


def build_optimizer(optimizer: tf.keras.optimizers.Optimizer,
                    variables: Sequence[Any]) -> None:
    if not optimizer.built:
        optimizer.build(variables)


def build_model(model: tf.keras.Model, spec: Any) -> None:
    # Keras' own build from symbolic inputs, which fit runs under a tf.distribute strategy.
    if hasattr(model, "_symbolic_build"):
        model._symbolic_build(data_batch=spec)


def check_fit_start(model: tf.keras.Model) -> None:
    refuse_loss_scale_outside(model.optimizer)


def check_first_step(model: tf.keras.Model) -> None:
    """After fit's first step: an optimizer wrapped once it had state (a loaded model's) must
    have been traced into this fit's train step; a train function traced before the wrapping
    (fit, then distributed_optimizer, then fit without compile) would never all-reduce."""
    optimizer = model.optimizer
    if not getattr(optimizer, "hvdtrain_wrapped_built", False):
        return
    if not getattr(optimizer, "hvdtrain_applied", False):
        raise UserError("the model's train function was made before its optimizer was made "
                        "distributed, so its steps would not all-reduce: call model.compile() "
                        "again after dist.distributed_optimizer()", shared=True)
    optimizer.hvdtrain_wrapped_built = False


class MetricAverage(tf.keras.callbacks.Callback):
    """The epoch's train metrics become the mean over ranks before anyone logs them: each
    value element-wise (a metric may be an array), once every rank is shown to log the same
    metrics with the same shapes (they are averaged by position, so a mismatch would mix
    unrelated numbers silently)."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not logs:
            return
        names = sorted(logs)
        values = [np.asarray(logs[n], np.float64) for n in names]
        layout = [(name, list(value.shape)) for name, value in zip(names, values)]
        # Horovod: every rank's metric names and shapes, so all ranks see the same mismatch.
        layouts = hvd.allgather_object(layout)
        if any(other != layouts[0] for other in layouts):
            rank = next(r for r, other in enumerate(layouts) if other != layouts[0])
            raise UserError(f"the ranks log different metrics, which cannot be averaged: rank 0 "
                            f"{_described(layouts[0])}, rank {rank} {_described(layouts[rank])}; "
                            f"compile the same metrics on every rank", shared=True)
        flat = np.concatenate([value.ravel() for value in values])
        # Horovod: one all-reduce of every metric value, in the same (sorted) order everywhere.
        means = hvd.allreduce(tf.constant(flat, tf.float64), op=hvd.Average,
                              name="hvdtrain_metric_average").numpy()
        start = 0
        for name, value in zip(names, values):
            mean = means[start:start + value.size].reshape(value.shape)
            logs[name] = float(mean) if value.ndim == 0 else mean
            start += value.size


def _described(layout: list) -> str:
    return ", ".join(name + (f" {tuple(shape)}" if shape else "") for name, shape in layout)


def metric_average_callback() -> tf.keras.callbacks.Callback:
    return MetricAverage()


def refuse_loss_scale_outside(optimizer: Any) -> None:
    """A loss scale optimizer around the distributed one (the mixed_float16 policy set after
    wrapping, which makes ``compile`` add it) checks each rank's own gradients for inf/NaN
    before the all-reduce: a rank that skips a step leaves its peers waiting in theirs. Every
    rank sees the same nesting, so every rank refuses together."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if (getattr(inner, "hvdtrain_distributed", False)
            and not getattr(optimizer, "hvdtrain_distributed", False)):
        raise UserError("a loss scale optimizer wraps the distributed optimizer, so each rank "
                        "would check its own gradients before the all-reduce and the ranks could "
                        "part ways: set the mixed_float16 policy before "
                        "dist.distributed_optimizer(), which then wraps the loss scale "
                        "optimizer itself", shared=True)


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    broadcast.broadcast_by_position(broadcast.tf_variables(variables), root_rank)
    draw_own_random_numbers([v for v in variables
                             if not isinstance(v, tf.Variable) and v.name == SEED_STATE],
                            root_rank)


def draw_own_random_numbers(seed_states: Sequence[Any], root_rank: int) -> None:
    """Each rank's random layers (Dropout, noise, augmentation) draw their own numbers: a
    broadcast copied root's seed states to every rank, which would give sample i of every
    rank's batch the same dropout mask. Rank r's state becomes root's with ``seed_offset``
    added to its seed (the counter stays): distinct on every rank, the same for a given seed
    and world size, and what a rank had before whenever root's state is broadcast again."""
    offset = broadcast.seed_offset(root_rank)
    for state in seed_states:
        state.assign(state.value + tf.constant([offset, 0], state.dtype))


def optimizer_variables(optimizer: tf.keras.optimizers.Optimizer) -> list:
    return list(optimizer.variables)  # a property in Keras 3


class TrainingState(ObjectState):
    """What elastic training commits in memory and syncs to new workers: the model's and the
    optimizer's variables, and plain values (the epoch, the run directory)."""

    def __init__(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                 **values: Any):
        self._model, self._optimizer = model, optimizer
        self._committed = self._read()
        # Horovod: plain values are synced from rank 0 by broadcasting them as objects.
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **values)

    @property
    def _variables(self) -> list:
        """Read at each use: an optimizer built after the state was made has slots since."""
        return [*self._model.variables, *optimizer_variables(self._optimizer)]

    def _read(self) -> list[np.ndarray]:
        return [np.array(v.numpy(), copy=True) for v in self._variables]

    def save(self) -> None:
        self._committed = self._read()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables, self._committed):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables)  # Horovod: a new worker takes rank 0's state
        self._committed = self._read()
        super().sync()


def elastic_state(model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                  **values: Any) -> Any:
    return TrainingState(model, optimizer, **values)


def save_model(model: tf.keras.Model, path: Path) -> None:
    # Keras 3 saves one .keras file (tf.keras.models.load_model reads it back).
    path.mkdir(parents=True, exist_ok=True)
    model.save(str(path / MODEL_FILE))


def load_model(path: Path) -> tf.keras.Model:
    return tf.keras.models.load_model(str(path / MODEL_FILE), compile=False)


def scale_loss(optimizer: tf.keras.optimizers.Optimizer, loss: tf.Tensor) -> tf.Tensor:
    return optimizer.scale_loss(loss)  # Keras 3's LossScaleOptimizer


def apply_scaled_gradients(optimizer: tf.keras.optimizers.Optimizer, gradients: list[tf.Tensor],
                           variables: Sequence[Any]) -> None:
    optimizer.apply_gradients(zip(gradients, variables))  # it unscales them itself


def sync_batch_normalization_class() -> type:
    from hvdtrain.distributed.batch_norm import SyncBatchNormalization
    return SyncBatchNormalization  # hvdtrain's own: Keras 3's synchronized needs tf.distribute
