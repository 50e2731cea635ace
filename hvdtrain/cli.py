"""``hvdtrain COMMAND ...``, one subcommand per module of ``COMMANDS``: the only reader of
sys.argv.

    hvdtrain train --preset digits                          # one process
    horovodrun -np 2 -H localhost:2 --gloo hvdtrain train   # 2 ranks over Gloo
    mpirun -np 2 hvdtrain train --set train.epochs=5        # 2 ranks over MPI
    mpirun -np 2 hvdtrain predict --run-dir RUN photos/     # a CSV of predicted classes
    hvdtrain data convert photos/ shards/ --image-shape 64,64,3   # one process
    hvdtrain --help                                         # every subcommand
    hvdtrain --version                                      # version, and commit in a clone
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

from hvdtrain.launch import rank_process, placement
from hvdtrain.commands import bench, data, doctor, evaluate, launch, parsing, predict, setup, train
from hvdtrain.errors import UserError
from hvdtrain import version

# Every subcommand, in the order 'hvdtrain --help' lists them; each module declares NAME,
# HELP, add_arguments(parser) and run(args) (hvdtrain/commands/__init__.py).
COMMANDS = (train, evaluate, predict, data, bench, doctor, setup, launch)
# How long a rank other than 0 waits before it exits with a shared error: long enough for a
# rank 0 still importing TensorFlow on a loaded host to print the line and exit (the launcher
# then ends this rank); if this rank is still alive afterwards, rank 0 did not find the error
# (a file that differs between hosts), and this rank reports it itself.
SHARED_ERROR_GRACE_S = 20.0

_train_config = train.config_from_args  # the config 'hvdtrain train ARGS' trains with


class _Version(argparse.Action):
    """--version: prints "hvdtrain 0.2.0 (commit 1d398bb)" and exits 0; git is asked only
    then, not on every command line."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print hvdtrain's version (and "
                         "its commit, run from a git checkout) and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"hvdtrain {version.describe()}", flush=True)
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = parsing.Parser(prog="hvdtrain", description="Data-parallel Keras training on N "
                            "ranks with Horovod ring all-reduce.")
    parser.add_argument("--version", action=_Version)
    parsing.add_commands(parser, COMMANDS)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv`` (default: sys.argv's) and runs its subcommand; returns the exit
    status (2: a user error, reported in one line by rank 0)."""
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = _parser().parse_args(argv)
        # What the user typed, for output that quotes it (bench all's README block); None
        # when the program is not hvdtrain (python -c, tests).
        args.command_line = (shlex.join(["hvdtrain", *argv])
                             if Path(sys.argv[0]).name == "hvdtrain" else None)
        return args.func(args)
    except UserError as e:
        if placement.launcher_rank() == 0 or not e.shared:
            print(f"hvdtrain: error: {e}", file=sys.stderr, flush=True)
        else:
            # Let rank 0 report and exit first: launchers tear the job down as soon as any
            # rank exits non-zero, which could otherwise kill rank 0 before it prints.
            time.sleep(SHARED_ERROR_GRACE_S)
            print(f"hvdtrain: error: (rank {placement.launcher_rank()}) {e}", file=sys.stderr,
                  flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def main() -> None:
    """The ``hvdtrain`` entry point: runs the command line and ends the process with its exit
    status (rank_process.end_rank, without TensorFlow's teardown)."""
    rank_process.whole_lines()
    rank_process.end_rank(run())


if __name__ == "__main__":
    main()
