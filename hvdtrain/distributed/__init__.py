"""The distributed layer: the only package that imports Horovod.

Everything else takes ``rank`` and ``size`` as plain arguments (see ``World``), so sharding,
schedules and config stay testable without MPI. This module is the layer's face: it hands on
the names the rest of hvdtrain and users' scripts call (``dist.init``, ``dist.World``, ...)
from the modules that hold them. What serves any Keras: a rank's start and placement
(``startup.py``, ``world.py``), the collectives on plain tensors and Python objects
(``collectives.py``), and the checks that make all ranks stop together (``agreement.py``).
What depends on the Keras version (the optimizer wrapper, the gradient tape, broadcasting
variables, metric averaging, elastic state, saving) sits behind the seam in ``binding.py``:
``keras2.py`` is Horovod's own Keras layer, for tf.keras 2 (TensorFlow 2.15); ``keras3.py`` is
hvdtrain's own, on Horovod's plain collectives, for Keras 3 (TensorFlow 2.16+).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hvdtrain.distributed import binding
from hvdtrain.distributed.agreement import (agree_or_fail, check_same_config, lost_a_rank,
                                            rank0_then_all)
from hvdtrain.distributed.batch_norm import (average_statistics, normalization_statistics,
                                             statistics_average_callback)
# The Keras-dependent half: callers write dist.distributed_optimizer and so on.
from hvdtrain.distributed.binding import (broadcast_variables, distributed_optimizer,
                                          distributed_tape, fit_callbacks, keras_version,
                                          unscale_gradients)
from hvdtrain.distributed.consistency import ConsistencyCheck, check_consistency
from hvdtrain.distributed.global_metrics import GlobalMetrics
from hvdtrain.distributed.collectives import (allgather_object, allreduce_each, allreduce_sum,
                                              broadcast_object, join)
from hvdtrain.distributed.elastic_retry import run as run_elastic
from hvdtrain.distributed.reducer import buckets_in_force, reduce_gradients
from hvdtrain.distributed.sync_batch_norm import synchronize_batch_norm
from hvdtrain.distributed.startup import (autograph_leaves_horovod_alone,
                                          horovod_settings_in_force, init, stack_description)
from hvdtrain.distributed.world import World, refresh_world, shard

__all__ = [  # the interface the rest of hvdtrain calls; nothing else imports Horovod
    "World", "init", "horovod_settings_in_force", "refresh_world", "stack_description", "shard",
    "ConsistencyCheck", "check_consistency", "GlobalMetrics",
    "autograph_leaves_horovod_alone",
    "check_same_config", "lost_a_rank", "agree_or_fail", "reduce_gradients", "buckets_in_force",
    "join",
    "allreduce_sum", "allgather_object", "allreduce_each", "broadcast_object", "rank0_then_all",
    "broadcast_variables", "distributed_optimizer", "distributed_tape", "elastic_state",
    "fit_callbacks", "keras_version", "load_model", "metric_average_callback",
    "optimizer_variables", "run_elastic", "save_model", "scale_loss", "unscale_gradients",
    "apply_scaled_gradients", "average_statistics", "normalization_statistics",
    "statistics_average_callback", "synchronize_batch_norm", "SyncBatchNormalization",
]


if TYPE_CHECKING:  # mypy: the names handed on below, with the binding protocol's signatures
    _active = binding.active()
    metric_average_callback = _active.metric_average_callback
    optimizer_variables = _active.optimizer_variables
    elastic_state = _active.elastic_state
    save_model = _active.save_model
    load_model = _active.load_model
    scale_loss = _active.scale_loss
    apply_scaled_gradients = _active.apply_scaled_gradients


def __getattr__(name: str) -> Any:
    """The active binding's own functions (``binding.FORWARDED``: saving, loading, elastic
    state, loss scaling, the optimizer's variables, the metric average callback), and
    ``SyncBatchNormalization``: this stack's synchronized BatchNormalization (Horovod's on
    Keras 2, hvdtrain's own on Keras 3), a drop-in for ``tf.keras.layers.BatchNormalization``;
    looked up when first asked for (the Keras version decides which)."""
    if name in binding.FORWARDED:
        return getattr(binding.active(), name)
    if name == "SyncBatchNormalization":
        return binding.active().sync_batch_normalization_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
