"""Where a process sits, from what the launcher and the OS say: pure helpers, no Horovod."""
from __future__ import annotations

import os
from typing import Callable, Iterable, Mapping

from hvdtrain.launch import launchers


def _horovod_first(names: Iterable[str | None]) -> tuple[str, ...]:
    """The variables named in ``names``, each once (launchers may share one), Horovod's own
    (HOROVOD_*) first: horovodrun's workers inherit the environment horovodrun started in, which
    may hold an outer launcher's numbers (those of an mpirun or srun task that ran horovodrun)."""
    named = dict.fromkeys(filter(None, names))
    return tuple(sorted(named, key=lambda name: not name.startswith("HOROVOD_")))


# Set before Python starts, enough to know a process's rank before hvd.init(): the variables of
# hvdtrain's launchers (launchers.LAUNCHERS), then those of launchers users start ranks with
# that hvdtrain never starts itself, so not rows of its table: MPICH and Intel MPI (PMI_RANK),
# PMIx (PMIX_RANK), SLURM's srun (SLURM_PROCID).
LAUNCHER_RANK_VARS = (*_horovod_first(row.rank_variable for row in launchers.LAUNCHERS.values()),
                      "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


# And the number of processes they started (srun: of this job step).
LAUNCHER_SIZE_VARS = (*_horovod_first(row.size_variable for row in launchers.LAUNCHERS.values()),
                      "PMI_SIZE", "SLURM_STEP_NUM_TASKS")


def launcher_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank as its launcher set it (the first of LAUNCHER_RANK_VARS that holds
    a number), or 0 when started alone; readable before hvd.init()."""
    for name in LAUNCHER_RANK_VARS:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 0


def launcher_size(environ: Mapping[str, str] = os.environ) -> int:
    """How many processes the launcher started; 1 for a process started without one."""
    for name in LAUNCHER_SIZE_VARS:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 1


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


def choose_gpu(visible_gpus: int, local_rank: int, local_size: int,
               device: str) -> tuple[int | None, str | None]:
    """(index of the GPU this rank pins, or None for the CPU; a user error, or None).

    One GPU per rank, chosen by LOCAL rank: ranks on one host get distinct GPUs whatever
    their global ranks are.
    """
    if device == "cpu":
        return None, None
    if device == "gpu" and visible_gpus == 0:
        return None, "run.device=gpu but TensorFlow sees no GPU here: use run.device=auto or cpu"
    if visible_gpus == 0:
        return None, None
    if local_size > visible_gpus:
        return None, (f"{local_size} ranks on this host but only {visible_gpus} GPUs visible: "
                      f"launch at most {visible_gpus} ranks per host, or pass "
                      f"--set run.device=cpu")
    return local_rank, None


def gloo_host_name_problem(environ: Mapping[str, str], host_name: str,
                           resolve: Callable[[str], str]) -> str | None:
    """Why a multi-host Gloo job would crash at start on this host, or None.

    Horovod 0.28.1 builds its Gloo process-set contexts from the host name, ignoring
    --network-interface: where the name resolves to loopback (Debian's "127.0.1.1 host"), the
    other hosts are told to connect to 127.0.0.1 and the job aborts inside Horovod.
    """
    several_hosts = environ.get("HOROVOD_CROSS_SIZE", "1").isdigit() and \
        int(environ.get("HOROVOD_CROSS_SIZE", "1")) > 1
    # Several "hosts" that are all this machine talk over loopback anyway (--network-interface lo).
    on_loopback = environ.get("HOROVOD_GLOO_IFACE") == "lo" or \
        environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "").startswith("127.")
    if environ.get("HOROVOD_CONTROLLER") != "gloo" or not several_hosts or on_loopback:
        return None
    fix = ("make every host's name resolve to its address on the training network "
           "(/etc/hosts or DNS); see docs/cluster.md, Common failures")
    try:
        address = resolve(host_name)
    except OSError:
        return f"this host's name '{host_name}' does not resolve, and Gloo needs it to: {fix}"
    if address.startswith("127.") or address == "::1":
        return (f"this host's name '{host_name}' resolves to {address}, so Gloo would tell the "
                f"other hosts to connect to loopback: {fix}")
    return None
