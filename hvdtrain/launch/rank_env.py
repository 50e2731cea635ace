"""A rank's environment: every variable hvdtrain sets before ``hvd.init()``, in one pure function.

Horovod reads HOROVOD_* and Open MPI reads OMPI_MCA_* once, inside ``hvd.init()`` (which calls
MPI_Init), so they must be in the environment before it. ``dist.init`` applies what
``rank_environment`` returns; nothing else in hvdtrain sets them.

Precedence, highest first:
  1. a config key the user set: ``horovod.fusion_threshold_mb``, ``cycle_time_ms``,
     ``autotune`` and ``timeline`` when not left at -1 / off / empty, and ``run.stall_warning_s``
     and ``run.stall_abort_s`` always (they have defaults of their own);
  2. what the environment already holds: the launcher's flags (``horovodrun --cycle-time-ms``,
     ``mpirun -x`` or ``--mca``) and the user's exports;
  3. hvdtrain's launch defaults, ``RANK_ENV_DEFAULTS`` (with a longer cycle for a process
     alone, ``ALONE_CYCLE_MS``).
"""
from __future__ import annotations

import os
from typing import Mapping

from hvdtrain.launch import placement
from hvdtrain.config import MB, HorovodConfig

# Horovod 0.28's own values when a variable is unset (horovod/common/operations.cc).
HOROVOD_DEFAULT_FUSION_MB = 128.0
HOROVOD_DEFAULT_CYCLE_MS = 1.0

# hvdtrain's launch defaults:
# - OMPI_MCA_mpi_yield_when_idle: with Open MPI's default a rank waiting in a collective
#   busy-polls, and Horovod's background thread spins on the core the training thread needs;
#   yielding when idle costs a little latency per wait.
# - HOROVOD_CYCLE_TIME: Horovod's background thread gathers ready tensors once per cycle (1 ms by
#   default), which sets the floor of every all-reduce; a shorter cycle lowers it.
# The evidence for both, and what the committed benchmark results do and do not show:
# docs/horovod-options.md, "Launch defaults".
RANK_ENV_DEFAULTS = {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "0.2"}
# - HOROVOD_CYCLE_TIME for a process alone (world size 1, not elastic): no gradient is
#   all-reduced there (both bindings pass them through), yet Horovod's background thread still
#   wakes every cycle on the core the training needs; a long cycle leaves that core to training,
#   and the few collectives left (the broadcast at the start, each epoch's metrics) wait at most
#   a cycle each. Measured: benchmarks/results/tax.md (bench tax).
ALONE_CYCLE_MS = "5"
# - Open MPI's all-reduce for two ranks on two hosts (mpirun: one rank a host): recursive
#   doubling, where each rank sends its whole buffer once and both directions of the link carry
#   it at once. Open MPI's own choice there (and ring, reduce-then-broadcast, Rabenseifner) took
#   1.2 to 1.4 times the link's time for MobileNetV2's 14 MB over TCP; recursive doubling 0.9
#   to 1.0 (benchmarks/results/network-mpi-allreduce). Larger jobs keep Open MPI's choice: there
#   recursive doubling sends more, and nothing here measured them. Any OMPI_MCA_coll_tuned_*
#   of the user's or the launcher's leaves Open MPI's decisions alone.
TWO_HOSTS_ALLREDUCE = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                       "OMPI_MCA_coll_tuned_allreduce_algorithm": "3"}


def from_config(options: HorovodConfig, *, stall_warning_s: int,
                stall_abort_s: int) -> dict[str, str]:
    """The variables the config sets (precedence 1). Horovod keys left at -1 / off / empty set
    nothing, so a launcher's own flags still work."""
    env = {
        # Horovod: the stall check warns, naming the tensor and the ranks that never submitted
        # it, once some ranks have waited this long in a collective ...
        "HOROVOD_STALL_CHECK_TIME_SECONDS": str(stall_warning_s),
        # Horovod: ... and shuts the job down after this long (0: never).
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(stall_abort_s),
    }
    if options.fusion_threshold_mb >= 0:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(options.fusion_threshold_mb * MB))
    if options.cycle_time_ms > 0:
        env["HOROVOD_CYCLE_TIME"] = f"{options.cycle_time_ms:g}"
    if options.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if options.timeline:
        env["HOROVOD_TIMELINE"] = os.path.abspath(options.timeline)
    return env


def is_elastic(environ: Mapping[str, str]) -> bool:
    """Whether this rank is a worker of horovodrun's elastic mode, whose world may change."""
    # Horovod: its elastic driver sets HOROVOD_ELASTIC=1 in every worker's environment.
    return bool(int(environ.get("HOROVOD_ELASTIC", 0)))


def rank_environment(options: HorovodConfig, environ: Mapping[str, str], *,
                     stall_warning_s: int = 60, stall_abort_s: int = 600) -> dict[str, str]:
    """What to set in this rank's environment before ``hvd.init()``, given the environment it
    started with: the config's variables, then the launch defaults still unset (see the module
    docstring for the precedence)."""
    env = from_config(options, stall_warning_s=stall_warning_s, stall_abort_s=stall_abort_s)
    defaults = dict(RANK_ENV_DEFAULTS)
    # Horovod: elastic training may add workers to a job that started alone.
    if placement.launcher_size(environ) == 1 and not is_elastic(environ):
        defaults["HOROVOD_CYCLE_TIME"] = ALONE_CYCLE_MS
    if two_ranks_on_two_hosts(environ) and not any(
            name.startswith("OMPI_MCA_coll_tuned_") for name in environ):
        defaults.update(TWO_HOSTS_ALLREDUCE)
    for name, value in defaults.items():
        if name not in environ and name not in env:
            env[name] = value
    return env


def two_ranks_on_two_hosts(environ: Mapping[str, str]) -> bool:
    """Whether Open MPI's mpirun started this rank as one of two, each on a host of its own."""
    return (environ.get("OMPI_COMM_WORLD_SIZE") == "2"
            and environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") == "1")


def stall_abort_in_force(environ: Mapping[str, str]) -> int:
    """The stall abort's seconds hvd.init() read (0: never): dist.init(stall_abort_s=...)."""
    return int(environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0") or 0)


def in_force(environ: Mapping[str, str]) -> str:
    """One line naming the run-time values Horovod uses, whoever set them."""
    fusion = environ.get("HOROVOD_FUSION_THRESHOLD")
    fusion_mb = int(fusion) / MB if fusion is not None else HOROVOD_DEFAULT_FUSION_MB
    cycle = float(environ.get("HOROVOD_CYCLE_TIME", HOROVOD_DEFAULT_CYCLE_MS))
    autotune = environ.get("HOROVOD_AUTOTUNE", "0").strip() not in ("", "0")
    timeline = environ.get("HOROVOD_TIMELINE") or "off"
    return (f"fusion {fusion_mb:g} MB{'' if fusion_mb else ' (off)'}, cycle {cycle:g} ms, "
            f"autotune {'on' if autotune else 'off'}, timeline {timeline}")
