"""The distributed layer: the only package that imports Horovod.

Everything else takes ``rank`` and ``size`` as plain arguments (see ``World``), so sharding,
schedules and config stay testable without MPI. This module holds what serves any Keras:
init and placement, the collectives on plain tensors and Python objects, and the checks that
make all ranks stop together. What depends on the Keras version (the optimizer wrapper, the
gradient tape, broadcasting variables, metric averaging, elastic state, saving) sits behind
the seam in ``binding.py``: ``keras2.py`` is Horovod's own Keras layer, for tf.keras 2
(TensorFlow 2.15); ``keras3.py`` is hvdtrain's own, on Horovod's plain collectives, for Keras 3
(TensorFlow 2.16+).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import tensorflow as tf

# Horovod: plain collectives on tensors; these serve any Keras version.
import horovod.tensorflow as hvd
# Horovod: the error a collective raises when a peer died mid-operation.
from horovod.common.exceptions import HorovodInternalError

from hvdtrain import config as config_lib
from hvdtrain import placement, rank_env
from hvdtrain.config import HorovodConfig
from hvdtrain.distributed import binding
# The Keras-dependent half, re-exported: callers write dist.distributed_optimizer and so on.
from hvdtrain.distributed.binding import (apply_scaled_gradients, broadcast_variables,
                                          distributed_optimizer, distributed_tape,
                                          elastic_state, fit_callbacks, keras_version,
                                          load_model, metric_average_callback,
                                          optimizer_variables, run_elastic, save_model,
                                          scale_loss, unscale_gradients)
from hvdtrain.distributed.batch_norm import (average_statistics, normalization_statistics,
                                             statistics_average_callback,
                                             synchronize_batch_norm)
from hvdtrain.distributed.reducer import reduce_gradients
from hvdtrain.errors import UserError

T = TypeVar("T")

__all__ = [  # the interface the rest of hvdtrain calls; nothing else imports Horovod
    "World", "init", "horovod_settings_in_force", "refresh_world",
    "check_same_config", "lost_a_rank", "agree_or_fail", "reduce_gradients", "join",
    "allreduce_sum", "allgather_object", "allreduce_each", "rank0_then_all",
    "broadcast_variables", "distributed_optimizer", "distributed_tape", "elastic_state",
    "fit_callbacks", "keras_version", "load_model", "metric_average_callback",
    "optimizer_variables", "run_elastic", "save_model", "scale_loss", "unscale_gradients",
    "apply_scaled_gradients", "average_statistics", "normalization_statistics",
    "statistics_average_callback", "synchronize_batch_norm", "SyncBatchNormalization",
]


def __getattr__(name: str) -> Any:
    """``SyncBatchNormalization``: this stack's synchronized BatchNormalization (Horovod's on
    Keras 2, hvdtrain's own on Keras 3), a drop-in for ``tf.keras.layers.BatchNormalization``;
    looked up when first asked for (the Keras version decides which)."""
    if name == "SyncBatchNormalization":
        return binding.sync_batch_normalization_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    controller: str      # "mpi" or "gloo"
    device: str          # "/GPU:0" or "/CPU:0": where this rank's ops run
    intra_op_threads: int
    inter_op_threads: int
    stack: str = ""      # e.g. "tensorflow 2.18.1, keras 3.15.1, horovod 0.28.1"

    @property
    def is_chief(self) -> bool:
        """Rank 0: the one rank that prints and writes."""
        return self.rank == 0


def init(*, device: str = "auto", intra_op_threads: int = 0, inter_op_threads: int = 0,
         options: HorovodConfig | None = None, stall_warning_s: int = 60,
         stall_abort_s: int = 600, elastic: bool = False) -> World:
    """Starts Horovod and places this rank: one GPU by local rank, or the CPU with its share of
    threads. Must run before TensorFlow executes its first op.

    ``elastic``: a worker may join a running job, whose ranks are then busy syncing state, so
    no collective may run here: a placement problem is raised on this rank alone.
    """
    # Horovod's Gloo would abort inside init() on a host whose name resolves to loopback: say so.
    problem = placement.gloo_host_name_problem(os.environ, socket.gethostname(),
                                               socket.gethostbyname)
    if problem:
        raise UserError(problem)
    # Horovod and MPI read their settings once, inside hvd.init(): see rank_env for what and why.
    os.environ.update(rank_env.rank_environment(options or HorovodConfig(), os.environ,
                                                stall_warning_s=stall_warning_s,
                                                stall_abort_s=stall_abort_s))
    # Horovod: one process per device; init() joins the ring built by horovodrun/mpirun.
    hvd.init()
    autograph_leaves_horovod_alone()
    rank, size = hvd.rank(), hvd.size()  # Horovod: this process's place in the job
    # Horovod: the place among the ranks of this host, which decides the GPU.
    local_rank, local_size = hvd.local_rank(), hvd.local_size()

    placed, problem = _pin_device(local_rank, local_size, device)
    share = placement.threads_per_rank(*placement.cores_available(), local_size)
    intra = intra_op_threads or share
    inter = inter_op_threads or min(2, share)
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)

    # Horovod: which controller the launcher chose (mpirun: MPI; horovodrun --gloo: Gloo).
    controller = "mpi" if hvd.mpi_enabled() and not hvd.gloo_enabled() else "gloo"
    world = World(rank, size, local_rank, local_size, controller, placed, intra, inter,
                  stack_description())
    if elastic and problem:
        raise UserError(problem)
    if not elastic:
        agree_or_fail(problem, world)
    return world


def autograph_leaves_horovod_alone() -> None:
    """Autograph (tf.function's rewrite of Python control flow into graph ops) skips Horovod's
    modules from now on, as it skips TensorFlow's and Keras' own. Horovod's graph code was
    written for graphs (plain Python around tf.cond): converting it changes nothing, yet it
    costs every rank a second or more of CPU at its first step, wherever a traced step reaches
    Horovod (the custom loop's tape, Keras 2's DistributedOptimizer, broadcasts). TensorFlow
    has no public switch per package; where its private rule list is missing, autograph
    converts Horovod as before: slower, the same graphs."""
    try:
        from tensorflow.python.autograph.core import config as autograph_config
    except ImportError:
        return
    rules = getattr(autograph_config, "CONVERSION_RULES", None)
    if rules is None or any(rule.matches("horovod") for rule in rules):
        return
    # Horovod: its Python only builds graph ops; a rule per package is how TensorFlow lists
    # its own libraries (numpy, keras, ...) to autograph.
    autograph_config.CONVERSION_RULES = (*rules, autograph_config.DoNotConvert("horovod"))


def _pin_device(local_rank: int, local_size: int, device: str) -> tuple[str, str | None]:
    """Makes one GPU (or none) visible to this rank; returns the device and any problem."""
    gpus = tf.config.list_physical_devices("GPU")
    index, problem = placement.choose_gpu(len(gpus), local_rank, local_size, device)
    if index is not None:
        # Horovod: pin one GPU per process by LOCAL rank, so ranks on a host never share one;
        # memory growth stops TensorFlow from reserving the whole card up front.
        tf.config.experimental.set_memory_growth(gpus[index], True)
        tf.config.set_visible_devices(gpus[index], "GPU")
        return "/GPU:0", problem
    if gpus:
        tf.config.set_visible_devices([], "GPU")
    return "/CPU:0", problem


def stack_description() -> str:
    """The versions in use, e.g. "tensorflow 2.21.0, keras 3.15.1, horovod 0.28.1"."""
    return (f"tensorflow {tf.__version__}, keras {keras_version()}, "
            f"horovod {importlib.metadata.version('horovod')}")


def horovod_settings_in_force() -> str:
    """The HOROVOD_* and Open MPI settings hvd.init() read, as one line for the banner."""
    return rank_env.in_force(os.environ)  # what hvd.init() read (see above)


def refresh_world(world: World) -> World:
    """The same process after an elastic reset: its rank and the world size may have changed."""
    # Horovod: after a reset, hvd.init() has rebuilt the ring with the workers left (or added).
    return dataclasses.replace(world, rank=hvd.rank(), size=hvd.size(),
                               local_rank=hvd.local_rank(), local_size=hvd.local_size())


def check_same_config(values: dict, world: World) -> None:
    """Stops every rank when any was started with a config other than rank 0's (a TOML file
    that differs between hosts, say): ranks would otherwise train with different settings."""
    if world.size == 1:
        return
    # Horovod: rank 0's config reaches every rank, which compares its hash with its own.
    root = hvd.broadcast_object(values, root_rank=0, name="hvdtrain_config")
    problem = None
    if config_lib.fingerprint(values) != config_lib.fingerprint(root):
        keys = config_lib.differences(values, root)
        problem = (f"the config differs from rank 0's (hash {config_lib.fingerprint(values)} vs "
                   f"{config_lib.fingerprint(root)}, in {', '.join(keys)}): start every rank "
                   f"with the same arguments and config file")
    agree_or_fail(problem, world)


def lost_a_rank(error: BaseException) -> bool:
    """True for the error a rank gets when another rank died (or the stall check gave up)
    while it waited in a collective."""
    # Horovod: its background thread shuts down and fails every pending collective.
    return isinstance(error, HorovodInternalError) or (
        isinstance(error, tf.errors.OpError) and "Horovod has been shut down" in str(error))


def agree_or_fail(problem: str | None, world: World) -> None:
    """A collective check: if any rank hit a user error, every rank raises it, together.

    A rank that simply exited on its own error would leave the others waiting forever in their
    next all-reduce; gathering everyone's verdict first makes all ranks stop within seconds.
    """
    if world.size == 1:
        if problem:
            raise UserError(problem)
        return
    # Horovod: gather every rank's verdict (None = fine) so all ranks take the same branch.
    verdicts = hvd.allgather_object(problem)
    failed = [(r, p) for r, p in enumerate(verdicts) if p]
    if failed:
        rank, first = failed[0]
        where = "" if len(failed) == world.size else f" (on rank {rank})"
        raise UserError(f"{first}{where}", shared=True)


def join() -> int:
    """Waits, answering the peers' all-reduces with zeros, until every rank has joined; returns
    the rank that joined last."""
    # Horovod: this rank has no batch left; it answers its peers' all-reduces with zeros until
    # every rank has joined. Returns the rank that joined last (it ran the most steps).
    # Run as a graph: with horovod 0.28.1 and TF 2.15 an EAGER hvd.join() waits correctly only
    # the first time; from the second call on it returns at once on the rank that joins first
    # (measured), whose next all-reduce then meets the other rank's old one.
    return int(tf.function(hvd.join)())


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """``root_rank``'s ``obj`` (any picklable value), on every rank."""
    # Horovod: root's Python value (e.g. the epoch to resume from) reaches every rank.
    return hvd.broadcast_object(obj, root_rank=root_rank)


def allreduce_sum(values: np.ndarray) -> np.ndarray:
    """``values`` summed element-wise over all ranks, in float64."""
    # Horovod: exact totals across ranks (sums of counts, not a mean of per-rank means).
    tensor = tf.constant(np.asarray(values, dtype=np.float64))
    return hvd.allreduce(tensor, op=hvd.Sum, name="hvdtrain_sum").numpy()


def allgather_object(obj: Any) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    # Horovod: every rank's Python value, in rank order, on every rank (benchmark figures).
    return hvd.allgather_object(obj)


def allreduce_each(tensors: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
    """Sums each tensor across ranks with its own all-reduce (the optimizer reduces gradients
    with a grouped all-reduce instead: ``reducer.py``). Called inside one tf.function, the
    all-reduces are submitted together, so Horovod fuses them into one buffer when tensor
    fusion is on."""
    # Horovod: one named all-reduce per tensor; names must match across ranks.
    return [hvd.allreduce(t, op=hvd.Sum, name=f"{name}.{i}") for i, t in enumerate(tensors)]


def rank0_then_all(work: Callable[[], T], world: World) -> T:
    """A collective: runs ``work`` on rank 0 alone (file system work such as opening the run
    directory), then gives its result, or its user error, to every rank."""
    result, problem = None, None
    if world.is_chief:
        try:
            result = work()
        except UserError as e:
            problem = str(e)
    agree_or_fail(problem, world)  # Horovod: rank 0's error stops every rank
    return broadcast_object(result)  # Horovod: rank 0's answer reaches every rank
