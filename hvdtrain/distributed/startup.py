"""A rank's start: the HOROVOD_* settings, hvd.init(), pinning to one GPU or a share of the CPU
cores, autograph's rule for Horovod, and the versions in use."""
from __future__ import annotations

import importlib.metadata
import os
import socket

import tensorflow as tf

# Horovod: init and this rank's place among the ranks.
import horovod.tensorflow as hvd

from hvdtrain.launch import placement, rank_env
from hvdtrain.config import HorovodConfig
from hvdtrain.distributed.agreement import agree_or_fail
from hvdtrain.distributed import reducer, writers
from hvdtrain.distributed.binding import keras_version
from hvdtrain.distributed.world import World, controller
from hvdtrain.errors import UserError


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

    share = placement.threads_per_rank(*placement.cores_available(), local_size)
    intra, inter = placement.thread_counts(
        share, intra_op_threads, inter_op_threads,
        overlap=reducer.buckets_in_force(options or HorovodConfig()) > 0)
    given = placement.given_devices(os.environ)
    try:
        placed, problem, pinned = _pin_device(local_rank, local_size, device, given)
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError as error:  # TensorFlow's devices and threads are fixed at its first op
        raise UserError(f"TensorFlow ran an op before Horovod's init, so this rank's device "
                        f"and threads can no longer be set ({error}): call dist.init() "
                        f"(hvd.init()) before any TensorFlow op, model or tensor") from None

    if size > 1:
        writers.write_safely()  # model files and TensorBoard on every rank: see writers.py
    world = World(rank, size, local_rank, local_size, controller(), placed, intra, inter,
                  stack_description())
    if elastic and problem:
        raise UserError(problem)
    if not elastic:
        shared = _shared_gpu(given, pinned) if size > 1 else None
        agree_or_fail(problem or shared, world)
    return world


def _shared_gpu(given: str | None, pinned: str | None) -> str | None:
    """A collective: the line naming two ranks of one host pinned to the same GPU, or None."""
    # Horovod: every rank's host and GPU, so that all ranks see the same clash.
    views = hvd.allgather_object((socket.gethostname(), given, pinned), name="hvdtrain_gpus")
    return placement.same_gpu_problem(views)


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


def _pin_device(local_rank: int, local_size: int, device: str,
                given: str | None) -> tuple[str, str | None, str | None]:
    """Makes one GPU (or none) visible to this rank; returns the device, any problem, and the
    GPU pinned as the host names it (placement.pinned_gpu)."""
    gpus = tf.config.list_physical_devices("GPU")
    index, problem = placement.choose_gpu(len(gpus), local_rank, local_size, device, given)
    if index is not None:
        # Horovod: pin one GPU per process by LOCAL rank (or the one the launcher gave this
        # rank), so ranks on a host never share one; memory growth stops TensorFlow from
        # reserving the whole card up front.
        tf.config.experimental.set_memory_growth(gpus[index], True)
        tf.config.set_visible_devices(gpus[index], "GPU")
        return "/GPU:0", problem, placement.pinned_gpu(given, index)
    if gpus:
        tf.config.set_visible_devices([], "GPU")
    return "/CPU:0", problem, None


def stack_description() -> str:
    """The versions in use, e.g. "tensorflow 2.21.0, keras 3.15.1, horovod 0.28.1"."""
    return (f"tensorflow {tf.__version__}, keras {keras_version()}, "
            f"horovod {importlib.metadata.version('horovod')}")


def horovod_settings_in_force() -> str:
    """The HOROVOD_* and Open MPI settings hvd.init() read, as one line for the banner."""
    return rank_env.in_force(os.environ)  # what hvd.init() read (see above)
