"""The launchers hvdtrain starts ranks with from Python (the benchmarks, doctor, the tests), as one
table: each launcher is one function that returns its command line and environment, as
accelerate's ``prepare_*_cmd_env`` and Horovod's ``runner/*_run.py`` do, and one row of LAUNCHERS.

    command, env = launchers.prepare("gloo", 2, ["hvdtrain", "train"])
    subprocess.run(command, env=env)

Each row holds every fact about its launcher that hvdtrain and its tests use: the command, the
variables that give a rank its number, the tag it prefixes a rank's lines with, how a rank's
traceback shows in its output, and the script of run_scripts/ that users start it with (the
user's side of the same launcher, README "Launching"). placement, ``hvdtrain launch`` and the
tests read them here: adding a launcher is one row (and its script, if it has one).

Nothing here imports Horovod or TensorFlow: a launch must not pay for either, and a rank's own
code may import this module.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence, get_args

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
    if ranks > (os.cpu_count() or 1):  # more ranks than the host has cores
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
class Script:
    """A launch script of run_scripts/, which users run from a shell, or as ``hvdtrain launch
    NAME`` after a pip install (the wheel ships run_scripts/ whole)."""
    name: str   # hvdtrain launch NAME
    file: str   # its file in run_scripts/
    help: str   # what it starts, in a few words (hvdtrain launch's help)
    # How to use a script that is submitted or handed to another rather than run, with {path}
    # (hvdtrain launch prints it); None: hvdtrain launch runs the script.
    usage: str | None = None


@dataclass(frozen=True)
class Entry:
    """One launcher: the function that builds its launch, what callers choose it by, and what
    its ranks and its output look like."""
    cmd_env: Callable[[int, Sequence[str], Options], CommandEnv]
    # Starts N ranks: offered wherever a choice of launchers for N ranks is (bench's
    # --launcher, doctor's smoke tests, the tests' launcher parameter).
    multi_rank: bool
    # Binds each rank to its own core under bind_to_core; where False, a benchmark rank pins
    # itself (hvdtrain.bench.shared.launch.pin_to_own_core) so that every launcher gives the
    # same budget.
    binds_cores: bool
    # Horovod: the controller its ranks join (world.controller), which doctor's smoke test
    # checks they report; None where there is no job to join (one process).
    controller: Literal["mpi", "gloo"] | None
    # How a failed rank ends the job. A line naming each failed rank's exit status ({rank},
    # {status}) where the launcher prints one, exits 1, and lets the other ranks notice the
    # loss (horovodrun); None where it exits with the failed rank's status and ends the
    # others at once (mpirun), or starts no ranks.
    rank_status_line: str | None
    # The variables it sets in each rank's environment before Python starts: its rank and the
    # number of ranks (placement reads them before hvd.init()); None where it starts no ranks.
    rank_variable: str | None
    size_variable: str | None
    # And its rank among the ranks of its host (a benchmark rank's core, before hvd.init()).
    local_rank_variable: str | None
    # The prefix of rank R's lines on one stream in its output, with {rank} and {stream}
    # (stdout, stderr); None where it adds none.
    tag: str | None
    # Tags every line, whatever Options.tag_output asks (horovodrun); else only when asked.
    always_tags: bool
    # A rank's traceback in its output (a regex, re.M), told apart from one of the launcher's
    # own: horovodrun prints its own traceback when a rank fails, mpirun none.
    rank_traceback: str
    # The script of run_scripts/ that starts it from a shell; None where it has none.
    script: Script | None

    def rank_tag(self, rank: int, stream: str = "stdout") -> str:
        """The prefix of rank ``rank``'s lines on ``stream`` (stdout, stderr) when the launcher
        tags them; "" where it does not."""
        return self.tag.format(rank=rank, stream=stream) if self.tag else ""

    @property
    def tag_pattern(self) -> str | None:
        """Any rank's tag on either stream, as a regex; None where it adds none."""
        if not self.tag:
            return None
        parts = re.split(r"(\{rank\}|\{stream\})", self.tag)
        wild = {"{rank}": r"\d+", "{stream}": "std(?:out|err)"}
        return "".join(wild.get(part, re.escape(part)) for part in parts)


# The table: one row per launcher, in the order choices are offered (the tests' ids and their
# --launcher-turns rotation follow it).
LAUNCHERS: dict[Launcher, Entry] = {
    "mpi": Entry(mpi_cmd_env, multi_rank=True, binds_cores=True, controller="mpi",
                 rank_status_line=None,
                 rank_variable="OMPI_COMM_WORLD_RANK", size_variable="OMPI_COMM_WORLD_SIZE",
                 local_rank_variable="OMPI_COMM_WORLD_LOCAL_RANK",
                 tag="[1,{rank}]<{stream}>:", always_tags=False, rank_traceback=r"Traceback",
                 script=Script("hostfile", "mpirun_hostfile.sh", "MPI over hosts")),
    # Its script, local.sh, runs this command on this host (over MPI where mpirun is installed).
    "gloo": Entry(gloo_cmd_env, multi_rank=True, binds_cores=False, controller="gloo",
                  rank_status_line="Process {rank} exit with status code {status}.",
                  rank_variable="HOROVOD_RANK", size_variable="HOROVOD_SIZE",
                  local_rank_variable="HOROVOD_LOCAL_RANK",
                  tag="[{rank}]<{stream}>:", always_tags=True,
                  rank_traceback=r"^\[\d+\]<std(out|err)>:Traceback",
                  script=Script("local", "local.sh", "N ranks here, MPI or else Gloo")),
    "single": Entry(single_cmd_env, multi_rank=False, binds_cores=False, controller=None,
                    rank_status_line=None,
                    rank_variable=None, size_variable=None, local_rank_variable=None,
                    tag=None, always_tags=False,
                    rank_traceback=r"Traceback", script=None),
}
# Every script of run_scripts/ that hvdtrain launch offers: the launchers' own (their rows),
# then those of launchers users start and hvdtrain never does (horovodrun's elastic mode,
# SLURM's batch script) and elastic's host discovery.
SCRIPTS = {script.name: script for script in [
    *(row.script for row in LAUNCHERS.values() if row.script),
    Script("elastic", "elastic.sh", "Gloo"),
    Script("slurm", "slurm.sbatch", "SLURM",
           usage="sbatch --nodes=N --ntasks-per-node=1 {path} [hvdtrain train args]"),
    Script("discover-hosts", "discover_hosts.sh", "elastic's hosts",
           usage='hvdtrain launch elastic ... -d "{path} hosts.txt" -- ...')]}

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
