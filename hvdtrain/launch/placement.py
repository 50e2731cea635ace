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
# And the rank among those of its host (srun: SLURM_LOCALID).
LAUNCHER_LOCAL_RANK_VARS = (*_horovod_first(row.local_rank_variable
                                            for row in launchers.LAUNCHERS.values()),
                            "SLURM_LOCALID")


def _first_number(names: tuple[str, ...], environ: Mapping[str, str], alone: int) -> int:
    """The first of ``names`` that holds a number in ``environ``, or ``alone``."""
    for name in names:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return alone


def launcher_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank as its launcher set it (the first of LAUNCHER_RANK_VARS that holds
    a number), or 0 when started alone; readable before hvd.init()."""
    return _first_number(LAUNCHER_RANK_VARS, environ, 0)


def launcher_local_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank among its host's as its launcher set it, or 0 when started alone;
    readable before hvd.init()."""
    return _first_number(LAUNCHER_LOCAL_RANK_VARS, environ, 0)


def launcher_size(environ: Mapping[str, str] = os.environ) -> int:
    """How many processes the launcher started; 1 for a process started without one."""
    return _first_number(LAUNCHER_SIZE_VARS, environ, 1)


def threads_per_rank(available_cores: int, total_cores: int, local_size: int) -> int:
    """This rank's fair share of the cores: all it is bound to, or an even split of the host.

    If the launcher bound the rank (mpirun --bind-to core) it sees fewer cores than the host
    has, and those are its own; otherwise ranks on one host share all cores and split them.
    """
    if available_cores < total_cores:
        return max(1, available_cores)
    return max(1, total_cores // max(1, local_size))


# TensorFlow ops a rank runs at once where its all-reduce overlaps backprop (buckets), on one
# core too: with one, TensorFlow runs the gradients that no later op needs (a bias's, a 1x1
# convolution's kernel) at the end of backprop, so the bucket that holds one waits for the
# whole backward pass (benchmarks/results/network-inter-op/). Without buckets, a rank of one
# core keeps one: a small model's step then has no thread hand-offs.
INTER_OP_THREADS = 2


def thread_counts(share: int, intra_op: int = 0, inter_op: int = 0, *,
                  overlap: bool = False) -> tuple[int, int]:
    """(intra-op, inter-op) TensorFlow threads of a rank with ``share`` cores, each the one
    asked for, or where 0: all its cores inside an op, and INTER_OP_THREADS ops at once, or
    fewer where the rank has fewer cores and its all-reduce does not ``overlap`` backprop."""
    return intra_op or share, inter_op or (INTER_OP_THREADS if overlap
                                           else min(INTER_OP_THREADS, share))


def cores_available() -> tuple[int, int]:
    """(cores this process may run on, cores on the host)."""
    total = os.cpu_count() or 1
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    return available, total


BIND_PER_TASK = ("bind one GPU per rank (srun --gpus-per-task=1 or --gpu-bind=single:1; one "
                 "GPU per pod), or let every rank see all of the host's GPUs")


def given_devices(environ: Mapping[str, str]) -> str | None:
    """The devices a launcher gave this rank (CUDA_VISIBLE_DEVICES), or None where unset."""
    return environ.get("CUDA_VISIBLE_DEVICES")


def choose_gpu(visible_gpus: int, local_rank: int, local_size: int, device: str,
               given: str | None = None) -> tuple[int | None, str | None]:
    """(index of the GPU this rank pins, or None for the CPU; a user error, or None).

    Every rank sees at least as many GPUs as its host runs ranks (all the host's GPUs): the
    one of its LOCAL rank, so ranks on one host get distinct GPUs whatever their global ranks.
    Fewer, where the launcher gave this rank GPUs of its own (``given``, its
    CUDA_VISIBLE_DEVICES, lists exactly the GPUs it sees; SLURM's per-task binding, one GPU
    per pod, a wrapper per local rank): the first of them; whether two ranks of a host were
    given the same one is for ``same_gpu_problem``. Fewer and not given per rank: refused,
    as ranks would share a GPU.
    """
    if device == "cpu":
        return None, None
    if device == "gpu" and visible_gpus == 0:
        return None, "run.device=gpu but TensorFlow sees no GPU here: use run.device=auto or cpu"
    if visible_gpus == 0:
        return None, None
    if local_size <= visible_gpus:
        return local_rank, None
    if given is not None and len([d for d in given.split(",") if d.strip()]) == visible_gpus:
        return 0, None
    return None, (f"{local_size} ranks on this host, and this one (local rank {local_rank}) sees "
                  f"{visible_gpus} GPU(s), CUDA_VISIBLE_DEVICES {_described(given)}: ranks would "
                  f"share a GPU; {BIND_PER_TASK}, launch at most {visible_gpus} ranks per "
                  f"host, or pass --set run.device=cpu")


def _described(given: str | None) -> str:
    return "unset" if given is None else f"'{given}'"


def pinned_gpu(given: str | None, index: int | None) -> str | None:
    """Which physical GPU a rank pinned, as its host names it (CUDA_VISIBLE_DEVICES' entry, or
    the index among all the host's GPUs), or None for the CPU."""
    if index is None:
        return None
    entries = [d.strip() for d in given.split(",")] if given is not None else []
    return entries[index] if index < len(entries) else str(index)


def same_gpu_problem(views: list[tuple[str, str | None, str | None]]) -> str | None:
    """Every rank's (host, CUDA_VISIBLE_DEVICES, pinned GPU) in rank order: the line naming two
    ranks of one host that pinned the same GPU (a launcher gave every rank the same one), or
    None."""
    seen: dict[tuple[str, str], int] = {}
    for rank, (host, given, gpu) in enumerate(views):
        if gpu is None:
            continue
        first = seen.setdefault((host, gpu), rank)
        if first != rank:
            return (f"ranks {first} and {rank} on host {host} would share GPU {gpu} "
                    f"(CUDA_VISIBLE_DEVICES {_described(views[first][1])} and "
                    f"{_described(given)}): {BIND_PER_TASK}")
    return None


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
