"""Where a process sits, from what the launcher and the OS say: pure helpers, no Horovod."""
from __future__ import annotations

import os
from typing import Mapping

# Launchers set one of these before Python starts (horovodrun, Open MPI, MPICH/Intel MPI, PMIx,
# SLURM's srun): enough to know a process's rank before hvd.init().
LAUNCHER_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                      "SLURM_PROCID")


def launcher_rank(environ: Mapping[str, str] = os.environ) -> int:
    for name in LAUNCHER_RANK_VARS:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 0


def threads_per_rank(available_cores: int, total_cores: int, local_size: int) -> int:
    """This rank's fair share of the cores: all it is bound to, or an even split of the host.

    If the launcher bound the rank (mpirun --bind-to core) it sees fewer cores than the host
    has, and those are its own; otherwise ranks on one host share all cores and split them.
    """
    if available_cores < total_cores:
        return max(1, available_cores)
    return max(1, total_cores // max(1, local_size))


def cores_available() -> tuple[int, int]:
    """(cores this process may run on, cores on the host)."""
    total = os.cpu_count() or 1
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    return available, total
