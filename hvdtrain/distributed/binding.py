"""The seam between hvdtrain and the installed Keras: one binding module per Keras, chosen once
per process. Everything that depends on the Keras version goes through the active binding.

``KerasBinding`` declares the functions every binding module (keras2.py, keras3.py) provides,
with their signatures; ``active`` returns each module as one, so that mypy (``make lint``)
fails when a binding lacks a function or its signature drifts. The functions below add what
hvdtrain checks around a binding's own; the others are reached as ``active().NAME``, or as
``dist.NAME`` for those in ``FORWARDED``.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence, cast

import tensorflow as tf

from hvdtrain.config import HorovodConfig
from hvdtrain.config.capabilities import Capabilities
from hvdtrain.distributed.broadcast import BroadcastInitialState, stall_watchdog
from hvdtrain.distributed.consistency import ConsistencyCheck
from hvdtrain.distributed.global_metrics import GlobalMetrics
from hvdtrain.distributed import batch_norm, reducer
from hvdtrain.errors import UserError
from hvdtrain.keras_version import keras_major, keras_version


class KerasBinding(Protocol):
    """The functions a binding module provides (its module-level functions, checked by mypy),
    and its table of what it runs."""

    CAPABILITIES: Capabilities

    def distributed_optimizer(self, optimizer: tf.keras.optimizers.Optimizer,
                              options: HorovodConfig, *, average_aggregated: bool = True
                              ) -> tf.keras.optimizers.Optimizer:
        """The optimizer whose update all-reduces the gradients first (accumulated over
        ``options.backward_passes_per_step`` batches: averaged, or summed)."""

    def broadcast_variables(self, variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
        """Root's values into every rank's variables."""

    def build_optimizer(self, optimizer: tf.keras.optimizers.Optimizer,
                        variables: Sequence[tf.Variable]) -> None:
        """The optimizer's slots created for ``variables``, before the first step."""

    def build_model(self, model: tf.keras.Model, spec: Any) -> None:
        """A model without weights built from its batches' spec, where Keras can."""

    def check_fit_start(self, model: tf.keras.Model) -> None:
        """Raises UserError, on every rank alike, for a compiled model fit cannot train."""

    def check_first_step(self, model: tf.keras.Model) -> None:
        """Raises UserError, on every rank alike, where the first step did not all-reduce."""

    def metric_average_callback(self) -> tf.keras.callbacks.Callback:
        """A fit callback: the epoch's train metrics averaged over ranks."""

    def optimizer_variables(self, optimizer: tf.keras.optimizers.Optimizer) -> list[tf.Variable]:
        """The optimizer's state, as a list of variables."""

    def elastic_state(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                      **values: Any) -> Any:
        """What elastic training commits and syncs."""

    def save_model(self, model: tf.keras.Model, path: Path) -> None:
        """The export in the format this Keras loads back."""

    def load_model(self, folder: Path) -> tf.keras.Model:
        """That export, uncompiled, for inference."""

    def scale_loss(self, optimizer: tf.keras.optimizers.Optimizer, loss: tf.Tensor) -> tf.Tensor:
        """A LossScaleOptimizer's scaled loss ..."""

    def apply_scaled_gradients(self, optimizer: tf.keras.optimizers.Optimizer,
                               gradients: list[tf.Tensor],
                               variables: Sequence[tf.Variable]) -> None:
        """... and its gradients applied, unscaled, checked for inf/NaN on the way."""

    def sync_batch_normalization_class(self) -> type:
        """The BatchNormalization whose training moments are the global batch's."""


class UnscalingBinding(Protocol):
    """A binding whose table lets it unscale gradients (Keras 2's) has this function too."""

    def unscale_gradients(self, optimizer: tf.keras.optimizers.Optimizer,
                          gradients: list[tf.Tensor]) -> list[tf.Tensor]:
        """A LossScaleOptimizer's gradients unscaled."""


if TYPE_CHECKING:  # mypy: the binding whose table allows unscale_gradients has the function
    from hvdtrain.distributed import keras2 as _unscaling
    _UNSCALING: UnscalingBinding = _unscaling


# The binding's functions that need nothing of hvdtrain's around them: ``hvdtrain.distributed``
# hands them on from the active binding under their own names (its ``__getattr__``).
FORWARDED = ("metric_average_callback", "optimizer_variables", "elastic_state", "save_model",
             "load_model", "scale_loss", "apply_scaled_gradients")


@functools.cache
def active() -> KerasBinding:
    """The installed Keras's binding module (keras2.py or keras3.py): the one way to reach it."""
    if keras_major() == 2:
        from hvdtrain.distributed import keras2
        return keras2
    if keras_major() == 3:
        from hvdtrain.distributed import keras3
        return keras3
    raise UserError(f"this TensorFlow ships Keras {keras_version()}; hvdtrain has Horovod "
                    f"bindings for Keras 2 and 3: install a supported stack (make install)")


def capabilities() -> Capabilities:
    """What this stack's binding runs: its table (``hvdtrain.config.capabilities``)."""
    return active().CAPABILITIES


def _refuse_buckets(table: Capabilities, options: HorovodConfig) -> None:
    if options.bucket_mb > 0 and table.bucket_mb:
        raise UserError(f"horovod.bucket_mb is not applied on {table.keras}: {table.bucket_mb}; "
                        f"leave it at 0")


def distributed_optimizer(optimizer: tf.keras.optimizers.Optimizer,
                          options: HorovodConfig | None = None) -> tf.keras.optimizers.Optimizer:
    """``optimizer`` made distributed: its update averages the gradients over ranks (ring
    all-reduce) first. Wrap a fresh optimizer, before compile."""
    options = options or HorovodConfig()
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer):
        raise UserError(f"distributed_optimizer() takes a Keras optimizer object, got "
                        f"{optimizer!r}: pass e.g. tf.keras.optimizers.Adam(0.001)")
    table = capabilities()
    if options.backward_passes_per_step > 1 and table.accumulation_in_fit:
        raise UserError("backward_passes_per_step > 1 is not applied by distributed_optimizer() "
                        "in fit: accumulate in hvdtrain's custom loop (--loop custom)")
    _refuse_buckets(table, options)
    if options.op == "adasum" and table.adasum_in_fit:
        raise UserError(f"on {table.keras} {table.adasum_in_fit}: for Adasum use "
                        f"dist.distributed_tape with a plain optimizer (hvdtrain's custom loop, "
                        f"--loop custom)")
    return active().distributed_optimizer(optimizer, options)


def horovod_optimizer(optimizer: tf.keras.optimizers.Optimizer, options: HorovodConfig, *,
                      average_aggregated: bool) -> tf.keras.optimizers.Optimizer:
    """Horovod's ``DistributedOptimizer`` (``horovod_api.py``): as ``distributed_optimizer``,
    with ``backward_passes_per_step`` run in ``fit`` too, as Horovod runs it."""
    table = capabilities()
    if options.op == "adasum" and table.adasum_in_fit:
        raise UserError(f"hvdtrain.horovod: DistributedOptimizer(op=hvd.Adasum): on "
                        f"{table.keras} {table.adasum_in_fit}: use hvd.DistributedGradientTape "
                        f"with a plain optimizer")
    return active().distributed_optimizer(optimizer, options,
                                                  average_aggregated=average_aggregated)


def distributed_tape(tape: tf.GradientTape,
                     options: HorovodConfig | None = None) -> tf.GradientTape:
    """``tape``, whose gradient() returns the gradients reduced over ranks (average or Adasum,
    as ``options`` say; by default averaged). Apply them with a plain optimizer: a distributed
    one refuses them."""
    options = options or HorovodConfig()
    _refuse_buckets(capabilities(), options)
    return reducer.ReducingTape(tape, options)  # a stand-in with its gradient()


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    """``root_rank``'s values assigned to ``variables`` on every rank."""
    # Horovod: every rank starts from root's values (fresh weights, or a restored checkpoint),
    # or ranks would train different models from the first step on.
    active().broadcast_variables(list(variables), root_rank)


def fit_callbacks(root_rank: int = 0, *, consistency_check: bool = True,
                  global_metrics: bool = True, repeated_samples_stop: bool = True
                  ) -> list[tf.keras.callbacks.Callback]:
    """For a library user's own ``model.fit``: the consistency check (``consistency.py``:
    unsharded data, an optimizer not distributed and ranks that drift apart stop every rank
    with one line), rank 0's initial state broadcast to every rank before the first step
    (after checking that every rank runs as many steps), the metrics read from their state
    added over the ranks (``global_metrics.py``; fit's and, from then on, the model's
    evaluate()'s), then averaged over ranks (what else a callback logged), the same
    normalization statistics on every rank, and under Gloo a stall watchdog. Put them first.
    ``repeated_samples_stop`` off (Horovod's API): ranks that drew mostly the same samples
    in their first epoch are told so in one line, not stopped."""
    binding = active()
    watchdog = stall_watchdog()
    broadcast = BroadcastInitialState(binding, root_rank)
    check = ([ConsistencyCheck(broadcast=broadcast, repeated_samples_stop=repeated_samples_stop)]
             if consistency_check else [])
    exact = [GlobalMetrics()] if global_metrics else []
    return [*check, broadcast, *exact, binding.metric_average_callback(),
            batch_norm.statistics_average_callback(),  # the same statistics on every rank
            *([watchdog] if watchdog else [])]


def unscale_gradients(optimizer: tf.keras.optimizers.Optimizer,
                      gradients: list[tf.Tensor]) -> list[tf.Tensor]:
    """Keras 2: the LossScaleOptimizer's gradients unscaled. Keras 3 refuses it with one line:
    its LossScaleOptimizer unscales inside apply_gradients (``apply_scaled_gradients``)."""
    table = capabilities()
    if table.unscale_gradients:
        raise UserError(f"unscale_gradients() does not exist on {table.keras}: "
                        f"{table.unscale_gradients}")
    return cast(UnscalingBinding, active()).unscale_gradients(optimizer, gradients)
