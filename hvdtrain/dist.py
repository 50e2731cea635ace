"""The distributed layer: the only module that imports Horovod.

Everything else takes ``rank`` and ``size`` as plain arguments (see ``World``), so the sharding,
schedules and config stay testable without MPI, and a Keras 3 path built on Horovod's plain
collectives can later sit beside the Keras 2 one kept here.
"""
from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import tensorflow as tf

# Horovod: plain collectives on tensors; these serve any Keras version.
import horovod.tensorflow as hvd
# Horovod: the Keras 2 wrapper (tf.keras in TF 2.15): DistributedOptimizer and callbacks.
import horovod.tensorflow.keras as hvd_keras
# Horovod: the error a collective raises when a peer died mid-operation.
from horovod.common.exceptions import HorovodInternalError

from hvdtrain import config as config_lib
from hvdtrain import hvd_options, placement
from hvdtrain.config import HorovodConfig
from hvdtrain.errors import UserError

T = TypeVar("T")


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

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def set_horovod_env(options: HorovodConfig, *, stall_warning_s: int = 60,
                    stall_abort_s: int = 600) -> None:
    """The HOROVOD_* settings hvdtrain takes from its config. Horovod reads them once, inside
    hvd.init(), so they must be in os.environ before it."""
    # Horovod: the stall check warns, naming the tensor and the ranks that never submitted it,
    # once some ranks have waited this long in a collective ...
    os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(stall_warning_s)
    # Horovod: ... and shuts the job down after this long (0: never), so a stalled rank cannot
    # hold the others in a collective forever.
    os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(stall_abort_s)
    # Horovod: fusion threshold, cycle time, autotune and timeline, where the config sets them.
    os.environ.update(hvd_options.runtime_env(options))
    # Horovod: hvd.init() starts MPI, which reads its settings from the environment there:
    # hvdtrain's launch defaults (yield when idle instead of busy-polling), unless set already.
    os.environ.update(placement.rank_env_defaults(os.environ))


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
    set_horovod_env(options or HorovodConfig(), stall_warning_s=stall_warning_s,
                    stall_abort_s=stall_abort_s)
    # Horovod: one process per device; init() joins the ring built by horovodrun/mpirun.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()  # Horovod: this process's place in the job
    # Horovod: the place among the ranks of this host, which decides the GPU.
    local_rank, local_size = hvd.local_rank(), hvd.local_size()

    gpus = tf.config.list_physical_devices("GPU")
    index, problem = placement.choose_gpu(len(gpus), local_rank, local_size, device)
    if index is not None:
        # Horovod: pin one GPU per process by LOCAL rank, so ranks on a host never share one;
        # memory growth stops TensorFlow from reserving the whole card up front.
        tf.config.experimental.set_memory_growth(gpus[index], True)
        tf.config.set_visible_devices(gpus[index], "GPU")
        placed = "/GPU:0"
    else:
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        placed = "/CPU:0"

    share = placement.threads_per_rank(*placement.cores_available(), local_size)
    intra = intra_op_threads or share
    inter = inter_op_threads or min(2, share)
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)

    # Horovod: which controller the launcher chose (mpirun: MPI; horovodrun --gloo: Gloo).
    controller = "mpi" if hvd.mpi_enabled() and not hvd.gloo_enabled() else "gloo"
    world = World(rank, size, local_rank, local_size, controller, placed, intra, inter)
    if elastic and problem:
        raise UserError(problem)
    if not elastic:
        agree_or_fail(problem, world)
    return world


def horovod_settings_in_force() -> str:
    return hvd_options.in_force(os.environ)  # what hvd.init() read (see above)


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


def elastic_state(model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                  **values: Any) -> Any:
    # Horovod: what elastic training commits in memory and syncs to new workers: weights,
    # optimizer slots and plain values (the epoch, the run directory).
    return hvd_keras.elastic.KerasState(model, optimizer=optimizer, **values)


def run_elastic(train: Callable[[Any], T]) -> Callable[[Any], T]:
    # Horovod: re-runs ``train`` after a worker is lost (state rolled back to the last commit)
    # or added (at the next commit), each time on the new ring, after syncing state from rank 0.
    return hvd_keras.elastic.run(train)


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


def distributed_optimizer(optimizer: tf.keras.optimizers.Optimizer,
                          options: HorovodConfig | None = None) -> tf.keras.optimizers.Optimizer:
    options = options or HorovodConfig()
    # Horovod: average gradients across ranks with ring all-reduce before every update
    # (compressed to float16 on the wire if asked; sparse gradients reduced densely if asked).
    return hvd_keras.DistributedOptimizer(optimizer, compression=_compression(options),
                                          sparse_as_dense=options.sparse_as_dense)


def distributed_tape(tape: tf.GradientTape, options: HorovodConfig) -> tf.GradientTape:
    # Horovod: tape.gradient() returns gradients already reduced across ranks (average or
    # Adasum), so every rank applies the same update.
    return hvd.DistributedGradientTape(tape, compression=_compression(options),
                                       sparse_as_dense=options.sparse_as_dense,
                                       op=_reduce_op(options))


def allreduce_gradients(gradients: Sequence[tf.Tensor], options: HorovodConfig) -> list[tf.Tensor]:
    """What ``distributed_tape`` does to its gradients, for dense gradients accumulated locally
    over several batches (backward_passes_per_step > 1): one all-reduce per k batches."""
    # Horovod: the tape's reduction and compression, one named all-reduce per variable.
    return [hvd.allreduce(grad, op=_reduce_op(options), compression=_compression(options),
                          name=f"hvdtrain_accumulated_grad_{i}")
            for i, grad in enumerate(gradients)]


def join() -> int:
    # Horovod: this rank has no batch left; it answers its peers' all-reduces with zeros until
    # every rank has joined. Returns the rank that joined last (it ran the most steps).
    # Run as a graph: with horovod 0.28.1 and TF 2.15 an EAGER hvd.join() waits correctly only
    # the first time; from the second call on it returns at once on the rank that joins first
    # (measured), whose next all-reduce then meets the other rank's old one.
    return int(tf.function(hvd.join)())


def _compression(options: HorovodConfig) -> Any:
    # Horovod: fp16 casts float32 gradients to float16 for the wire and back after it.
    return hvd.Compression.fp16 if options.compression == "fp16" else hvd.Compression.none


def _reduce_op(options: HorovodConfig) -> Any:
    # Horovod: Adasum combines gradients by their directions instead of averaging them.
    return hvd.Adasum if options.op == "adasum" else hvd.Average


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    # Horovod: every rank starts from root's values (fresh weights, or a restored checkpoint),
    # or ranks would train different models from the first step on.
    hvd.broadcast_variables(list(variables), root_rank=root_rank)


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    # Horovod: root's Python value (e.g. the epoch to resume from) reaches every rank.
    return hvd.broadcast_object(obj, root_rank=root_rank)


def allreduce_sum(values: np.ndarray) -> np.ndarray:
    # Horovod: exact totals across ranks (sums of counts, not a mean of per-rank means).
    tensor = tf.constant(np.asarray(values, dtype=np.float64))
    return hvd.allreduce(tensor, op=hvd.Sum, name="hvdtrain_sum").numpy()


def metric_average_callback() -> tf.keras.callbacks.Callback:
    # Horovod: the epoch's train metrics become the mean over ranks before anyone logs them.
    return hvd_keras.callbacks.MetricAverageCallback()


def allgather_object(obj: Any) -> list:
    # Horovod: every rank's Python value, in rank order, on every rank (benchmark figures).
    return hvd.allgather_object(obj)


def allreduce_each(tensors: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
    """Sums each tensor across ranks with its own all-reduce, the way the optimizer reduces
    gradients. Called inside one tf.function, the all-reduces are submitted together, so
    Horovod fuses them into one buffer when tensor fusion is on."""
    # Horovod: one named all-reduce per tensor; names must match across ranks.
    return [hvd.allreduce(t, op=hvd.Sum, name=f"{name}.{i}") for i, t in enumerate(tensors)]
