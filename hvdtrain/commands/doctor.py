"""``hvdtrain doctor``: can this environment run a 2-rank job? Checked, one line per check."""
from __future__ import annotations

import argparse

from hvdtrain.install import doctor

NAME = "doctor"
HELP = ("check this environment: Python, TensorFlow, Keras, Horovod's ops, MPI and Gloo, GPUs, "
        "and a 2-rank all-reduce under each launcher (exit 0 only when a 2-rank job works)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Checks what a 2-rank hvdtrain job needs, each failure one line with the command that "
        "fixes it: Python, TensorFlow and Keras (and the Horovod binding hvdtrain uses), "
        "whether Horovod's TensorFlow ops load in this interpreter (in a subprocess), the MPI "
        "and Gloo controllers, Open MPI and mpirun, the GPUs TensorFlow sees, and a 2-rank "
        "all-reduce under horovodrun --gloo and under mpirun, its result checked.")
    parser.add_argument("--report", action="store_true",
                        help="after the checks, print one block to paste into a bug report "
                             "(Markdown): versions and hvdtrain's commit, the OS, CPUs and "
                             "/dev/shm, Horovod's patches and build, Open MPI's components, every "
                             "HOROVOD_*, OMPI_MCA_*, TF_* and NCCL_* setting, GPUs, the "
                             "launcher's variables, the 2-rank all-reduce's time")


def run(args: argparse.Namespace) -> int:
    return doctor.run(paste=args.report)
