"""The launchers hvdtrain starts ranks with from Python (the benchmarks, doctor, the tests), as one
table: each launcher is one function that returns its command line and environment, as
accelerate's ``prepare_*_cmd_env`` and Horovod's ``runner/*_run.py`` do, and one row of LAUNCHERS.

    command, env = launchers.prepare("gloo", 2, ["hvdtrain", "train"])
    subprocess.run(command, env=env)

Nothing here imports Horovod or TensorFlow: a launch must not pay for either. The launch
scripts of run_scripts/ are the user's side of the same launchers (README, "Launching").
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence, get_args

from hvdtrain.launch import placement
from hvdtrain.errors import UserError
from hvdtrain.launch.rank_process import quiet_tensorflow

Launcher = Literal["mpi", "gloo", "single"]

BIN = Path(sys.executable).parent  # the venv's horovodrun and hvdtrain, next to this Python
# How to install mpirun: true for a checkout and a pip install alike (doctor says it too).
OPEN_MPI_FIX = "apt-get install openmpi-bin libopenmpi-dev (or load your cluster's MPI module)"
# Open MPI refuses to start as root (CI, containers) unless told.
ALLOW_RUN_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclass(frozen=True)
class Options:
    """What a caller may ask of any launcher; one that has no use for an option ignores it."""
    # One core per rank (the benchmarks), where the launcher can bind ranks.
    bind_to_core: bool = False
    # Every output line prefixed with its rank (the tests tell the ranks' lines apart).
    tag_output: bool = False
    # Variables added to the launch's environment (launch_env's ``extra``).
    env: Mapping[str, str] = field(default_factory=dict)


CommandEnv = tuple[list[str], dict[str, str]]


def launch_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a launch, under any launcher: the venv first on PATH
    (every rank must find the same horovodrun, hvdtrain and python), TensorFlow quiet, mpirun
    allowed as root, then ``extra``. Returns a new dict; os.environ is left as it is."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    quiet_tensorflow(env)
    env.update(ALLOW_RUN_AS_ROOT)
    env.update(extra or {})
    return env


def mpi_cmd_env(ranks: int, argv: Sequence[str], options: Options) -> CommandEnv:
    """``mpirun -np RANKS ARGV``, oversubscribed when there are more ranks than cores;
    ``bind_to_core`` binds one core per rank, Open MPI's own default for 2 ranks or fewer, made
    explicit so that every N gets one core per rank; ``tag_output`` adds ``--tag-output``
    (``[1,R]<stdout>:``). Returns (command, environment); UserError when mpirun is missing."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise UserError(f"mpirun not on PATH: {OPEN_MPI_FIX}; 'hvdtrain doctor' checks the rest")
    if ranks > placement.cores_available()[1]:
        binding = ["--oversubscribe", "--bind-to", "none"]
    else:
        binding = ["--bind-to", "core", "--map-by", "core"] if options.bind_to_core else []
    tag = ["--tag-output"] if options.tag_output else []
    # A failed job's other ranks are killed at once, not after Open MPI's default second:
    # SIGTERM would end hvdtrain's ranks as abruptly (they handle no signal, and a checkpoint
    # is written whole or not at all), so the second was only a wait at the end of every job
    # that stopped on an error.
    teardown = ["--mca", "odls_base_sigkill_timeout", "0"]
    return ([mpirun, *tag, "-np", str(ranks), *binding, *teardown, *argv],
            launch_env(options.env))


def gloo_cmd_env(ranks: int, argv: Sequence[str], options: Options) -> CommandEnv:
    """``horovodrun -np RANKS -H localhost:RANKS --gloo ARGV`` on this host: Horovod's own
    launcher with its Gloo controller, no MPI. It tags every line itself (``[R]<stdout>:``) and
    cannot bind ranks to cores (benchmark ranks pin themselves). Returns (command, environment)."""
    command = [str(BIN / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}",
               "--gloo", *argv]
    return command, launch_env(options.env)


def single_cmd_env(ranks: int, argv: Sequence[str], options: Options) -> CommandEnv:
    """``ARGV`` itself: one process, no launcher (Horovod then runs a world of one). Returns
    (command, environment); ValueError for more than one rank."""
    if ranks != 1:
        raise ValueError(f"launcher 'single' runs one process, not {ranks}")
    return list(argv), launch_env(options.env)


@dataclass(frozen=True)
class Entry:
    """One launcher: the function that builds its launch, and what callers choose it by."""
    cmd_env: Callable[[int, Sequence[str], Options], CommandEnv]
    # Starts N ranks: offered wherever a choice of launchers for N ranks is (bench's
    # --launcher, doctor's smoke tests, the tests' launcher parameter).
    multi_rank: bool
    # Binds each rank to its own core under bind_to_core; where False, a benchmark rank pins
    # itself (hvdtrain_bench.shared.launch.pin_to_own_core) so that every launcher gives the
    # same budget.
    binds_cores: bool
    # Horovod: the controller its ranks join (world.controller), which doctor's smoke test
    # checks they report; None where there is no job to join (one process).
    controller: Literal["mpi", "gloo"] | None


# The table: one row per launcher, in the order choices are offered (the tests' ids and their
# --launcher-turns rotation follow it).
LAUNCHERS: dict[Launcher, Entry] = {
    "mpi": Entry(mpi_cmd_env, multi_rank=True, binds_cores=True, controller="mpi"),
    "gloo": Entry(gloo_cmd_env, multi_rank=True, binds_cores=False, controller="gloo"),
    "single": Entry(single_cmd_env, multi_rank=False, binds_cores=False, controller=None),
}
MULTI_RANK: tuple[Launcher, ...] = tuple(name for name, entry in LAUNCHERS.items()
                                         if entry.multi_rank)
assert set(LAUNCHERS) == set(get_args(Launcher)), "a launcher named but not in the table"


def entry(launcher: str) -> Entry:
    """The table's row for ``launcher``; ValueError for a name not in it."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}")
    return LAUNCHERS[launcher]


def prepare(launcher: str, ranks: int, argv: Sequence[str], *, bind_to_core: bool = False,
            tag_output: bool = False, env: Mapping[str, str] | None = None) -> CommandEnv:
    """(command, environment) that start ``ranks`` copies of ``argv`` under ``launcher``, with
    ``env`` added to the environment (see Options for the rest)."""
    options = Options(bind_to_core=bind_to_core, tag_output=tag_output, env=dict(env or {}))
    return entry(launcher).cmd_env(ranks, argv, options)


def launch_command(launcher: str, ranks: int, argv: Sequence[str], *,
                   bind_to_core: bool = False, tag_output: bool = False) -> list[str]:
    """The command line alone of ``prepare``: for callers that run it with launch_env()."""
    return prepare(launcher, ranks, argv, bind_to_core=bind_to_core,
                   tag_output=tag_output)[0]
