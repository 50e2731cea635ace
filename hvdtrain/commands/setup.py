"""``hvdtrain setup horovod``: Horovod built against the TensorFlow of this environment."""
from __future__ import annotations

import argparse

from hvdtrain.install import horovod_install

NAME = "setup"
HELP = (f"build Horovod {horovod_install.HOROVOD_VERSION} against this environment's "
        f"TensorFlow, with MPI and Gloo (nothing is rebuilt when it works)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"Builds Horovod {horovod_install.HOROVOD_VERSION} in the environment of the Python "
        f"that runs hvdtrain, against the TensorFlow installed there (with hvdtrain's patch "
        f"from TensorFlow 2.19 on), with MPI and Gloo. Needs Open MPI's compiler wrapper "
        f"(mpicxx), g++, make and CMake 3. Nothing is rebuilt when Horovod "
        f"{horovod_install.HOROVOD_VERSION} is installed and its TensorFlow ops load.")
    parser.add_argument("what", choices=["horovod"], help="what to set up")
    parser.add_argument("--rebuild", action="store_true",
                        help="build even when the installed Horovod works")
    parser.add_argument("--dry-run", action="store_true",
                        help="only say whether a build is needed (exit 1 when it is)")


def run(args: argparse.Namespace) -> int:
    return horovod_install.setup_horovod(rebuild=args.rebuild, dry_run=args.dry_run)
