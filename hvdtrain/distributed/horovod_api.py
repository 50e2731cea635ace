"""Horovod's own TF2 API (``horovod.tensorflow``), served on either Keras through hvdtrain: what
``hvdtrain.horovod.tensorflow`` exports, so that a Horovod script changes only its import line.

Horovod's plain collectives on tensors work whatever the Keras version, and are Horovod's own
here. What touches Keras variables or optimizers (the tape, the optimizer, broadcasting
variables) goes through hvdtrain's binding, with its checks: the reduction of
``reducer.py``, the broadcast by position, per-rank dropout seeds. Options Horovod has and
hvdtrain does not run stop every rank with one line (``refuse``).
"""
from __future__ import annotations

import sys
from typing import Any, NoReturn, Sequence

import tensorflow as tf

# Horovod: its own collectives, process sets and build facts; they serve any Keras.
import horovod.tensorflow as hvd
from horovod.tensorflow import (Adasum, Average, Compression, Max, Min,  # noqa: F401
                                ProcessSet, Product, Sum, add_process_set, allgather,
                                allgather_object, alltoall, broadcast, broadcast_object,
                                broadcast_object_fn, ccl_built, cross_rank, cross_size,
                                cuda_built, ddl_built, global_process_set, gloo_built,
                                gloo_enabled, gpu_available, grouped_allgather,
                                grouped_allreduce, grouped_reducescatter, is_homogeneous,
                                is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                                mpi_threads_supported, nccl_built, rank, reducescatter,
                                remove_process_set, rocm_built, shutdown, size, start_timeline,
                                stop_timeline)

from hvdtrain.config import HorovodConfig
from hvdtrain.distributed import binding, collectives, startup, xla_default
from hvdtrain.errors import UserError

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "start_timeline", "stop_timeline", "Compression", "Average", "Sum", "Adasum",
    "Min", "Max", "Product", "is_homogeneous", "gpu_available", "broadcast_object_fn",
    "grouped_reducescatter",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "allreduce",
    "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
    "reducescatter", "join", "broadcast_object", "allgather_object", "broadcast_variables",
    "DistributedGradientTape", "DistributedOptimizer",
]  # and SyncBatchNormalization, looked up when first asked for (__getattr__)


def refuse(name: str, why: str) -> NoReturn:
    """Stops this rank (every rank runs the same line of the script) with one line."""
    raise UserError(f"hvdtrain.horovod: {name} {why}")


def _one_line_user_errors() -> None:
    """A UserError a script does not catch prints as one line, as hvdtrain's own commands
    print it, on rank 0 only when every rank raised it; any other exception as before."""
    hook = sys.excepthook
    if getattr(hook, "hvdtrain", False):
        return

    def excepthook(kind: type, error: BaseException, trace: Any) -> None:
        if not isinstance(error, UserError):
            hook(kind, error, trace)
            return
        # Horovod: rank 0 speaks for the ranks when every rank stopped on the same error.
        if not (error.shared and hvd.is_initialized() and hvd.rank() != 0):
            print(f"hvdtrain: error: {error}", file=sys.stderr, flush=True)
    excepthook.hvdtrain = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Horovod's ``init``, as hvdtrain starts a rank (``dist.init``): Horovod's settings, one
    GPU by local rank or the CPU with its share of threads, autograph leaving Horovod alone.
    It runs no collective and no TensorFlow op, so that a script may still configure its GPUs
    after it, as Horovod's examples do. Once Horovod runs (a second call, or after
    ``dist.init``), only hvdtrain's script-wide settings are made: uncaught UserErrors in one
    line, and on Keras 3 ``jit_compile`` left at its default meaning no XLA."""
    if comm is not None or process_sets is not None:
        refuse("init(comm=..., process_sets=...)", "is not offered: hvdtrain runs one job of "
               "every rank; start it with horovodrun or mpirun")
    if not hvd.is_initialized():
        # A placement problem is this rank's own: no collective here (see the docstring).
        startup.init(elastic=True)
    _one_line_user_errors()
    if binding.keras_version().startswith("3."):
        xla_default.leave_xla_off_by_default()


def join(device: str = "") -> int:
    """Waits, answering the peers' all-reduces with zeros, until every rank has joined."""
    return collectives.join()


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: Any = Compression.none, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: str | None = None,
              process_set: Any = global_process_set, ignore_name_scope: bool = False) -> Any:
    """Horovod's ``allreduce`` of a tensor; a Keras 3 variable is read as a tensor first."""
    # Horovod: its own all-reduce of a plain tensor (a Keras 3 Variable converts to one).
    return hvd.allreduce(_tensor(tensor), average=average, device_dense=device_dense,
                         device_sparse=device_sparse, compression=compression, op=op,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         name=name, process_set=process_set,
                         ignore_name_scope=ignore_name_scope)


def _tensor(value: Any) -> Any:
    if isinstance(value, (tf.Tensor, tf.Variable, tf.IndexedSlices)):
        return value
    return tf.convert_to_tensor(value)


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0,
                        process_set: Any = global_process_set, inplace: bool = False) -> None:
    """Root's values into ``variables`` on every rank, matched by position (Horovod matches
    them by ``var.name``, which Keras numbers per process): Keras 3 variables, optimizer
    variables and plain ``tf.Variable``; each rank then draws its own dropout masks."""
    _global_only("broadcast_variables", process_set)
    binding.broadcast_variables(variables, root_rank)


def _global_only(name: str, process_set: Any) -> None:
    if process_set is not global_process_set and process_set is not None:
        refuse(f"{name}(process_set=...)", "is not offered for training: hvdtrain reduces "
               "gradients over every rank; the collectives (allreduce, ...) take process sets")


def options(name: str, *, compression: Any = Compression.none, sparse_as_dense: bool = False,
            op: Any = None, backward_passes_per_step: int = 1,
            process_set: Any = global_process_set, device_dense: str = "",
            device_sparse: str = "") -> HorovodConfig:
    """Horovod's optimizer and tape options as hvdtrain's ``HorovodConfig``; the ones hvdtrain
    does not run refused. Horovod's ``num_groups``/``groups`` and
    ``gradient_predivide_factor`` are not options here: hvdtrain reduces every dense gradient
    as one flat tensor (one group; across hosts one per bucket, HorovodConfig.buckets_in_force)
    and averages in one step, which gives the same average."""
    _global_only(name, process_set)
    if device_dense or device_sparse:
        refuse(f"{name}(device_dense=..., device_sparse=...)", "is not offered: each rank "
               "reduces on the device it was pinned to by local rank")
    if compression not in (Compression.none, Compression.fp16):
        refuse(f"{name}(compression={compression!r})", "is not offered: use "
               "hvd.Compression.none or hvd.Compression.fp16")
    ops = {None: "average", Average: "average", Adasum: "adasum"}
    if op not in ops:
        refuse(f"{name}(op={op!r})", "is not offered for gradients: hvdtrain averages them "
               "(hvd.Average, the default) or combines them with hvd.Adasum")
    if int(backward_passes_per_step) < 1:
        refuse(f"{name}(backward_passes_per_step={backward_passes_per_step})",
               "must be 1 or more")
    return HorovodConfig(compression="fp16" if compression is Compression.fp16 else "none",
                         sparse_as_dense=bool(sparse_as_dense), op=ops[op],  # type: ignore[arg-type]
                         backward_passes_per_step=int(backward_passes_per_step))


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = Compression.none,
                            sparse_as_dense: bool = False, op: Any = None,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = global_process_set,
                            scale_local_gradients: bool = True) -> Any:
    """``gradtape``, whose ``gradient()`` returns the gradients averaged over ranks: apply
    them with a plain optimizer."""
    config = options("DistributedGradientTape", compression=compression, op=op,
                     sparse_as_dense=sparse_as_dense, process_set=process_set,
                     device_dense=device_dense, device_sparse=device_sparse)
    return _Tape(binding.distributed_tape(gradtape, config), gradtape)


class _Tape:
    """A distributed tape that is also usable as its GradientTape (``with``, ``watch``)."""

    def __init__(self, reducing: Any, tape: tf.GradientTape):
        self._reducing, self._tape = reducing, tape

    def gradient(self, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        return self._reducing.gradient(target, sources, *args, **kwargs)

    def __enter__(self) -> "_Tape":
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: Any = None,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """A Keras optimizer whose update averages the gradients over ranks first, for ``fit``
    and for an own ``train_step`` (``apply_gradients``). ``backward_passes_per_step`` k:
    k batches' gradients are accumulated locally (summed, or averaged with
    ``average_aggregated_gradients``), then averaged over ranks and applied once."""
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer):
        refuse("DistributedOptimizer", f"takes a Keras optimizer, got {type(optimizer).__name__}"
               f": TensorFlow 1's optimizers need graph sessions, which TensorFlow 2 scripts "
               f"do not have")
    config = options("DistributedOptimizer", compression=compression, op=op,
                     sparse_as_dense=sparse_as_dense, process_set=process_set,
                     backward_passes_per_step=backward_passes_per_step,
                     device_dense=device_dense, device_sparse=device_sparse)
    return binding.horovod_optimizer(optimizer, config,
                                     average_aggregated=bool(average_aggregated_gradients))


def __getattr__(name: str) -> Any:
    """``SyncBatchNormalization``: this stack's synchronized BatchNormalization; and the names
    of Horovod's API that TensorFlow 2 with Keras cannot serve, each a refusal in one line."""
    if name == "SyncBatchNormalization":
        return binding.active().sync_batch_normalization_class()
    if name in NOT_SERVED:
        def refused(*args: Any, **kwargs: Any) -> NoReturn:
            refuse(name, NOT_SERVED[name])
        return refused
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


NOT_SERVED = {  # Horovod's public names that hvdtrain refuses, and why
    "broadcast_global_variables": "needs TensorFlow 1's global variables and sessions: use "
                                  "hvd.broadcast_variables(model.variables, root_rank=0) after "
                                  "the first step, or "
                                  "hvd.callbacks.BroadcastGlobalVariablesCallback in fit",
    "PartialDistributedGradientTape": "is not offered: hvdtrain reduces every trainable "
                                      "variable's gradient (local layers would drift apart "
                                      "silently under its consistency check)",
    "PartialDistributedOptimizer": "is not offered: hvdtrain reduces every trainable "
                                   "variable's gradient",
    "broadcast_": "(in-place broadcast of a variable) is not offered: use "
                  "hvd.broadcast_variables([variable], root_rank)",
    "allreduce_": "(in-place all-reduce) is not offered: use hvd.allreduce",
    "grouped_allreduce_": "(in-place grouped all-reduce) is not offered: use "
                          "hvd.grouped_allreduce",
}

