"""``hvdtrain launch local|hostfile|elastic|slurm|discover-hosts``: the launch scripts of
run_scripts/, reachable after a pip install (the wheel ships them under hvdtrain/shipped/);
``hvdtrain launch k8s``: a Kubeflow MPIJob that runs the hostfile one (hvdtrain/commands/k8s.py)."""
from __future__ import annotations

import argparse
import os

from hvdtrain.install import shipped
from hvdtrain.commands import k8s

NAME = "launch"
HELP = ("run a launch script: local (N ranks here, MPI or else Gloo), hostfile (MPI over "
        "hosts), elastic (Gloo); slurm and discover-hosts print theirs, k8s prints a Kubeflow "
        "MPIJob ('hvdtrain launch NAME --help')")
# name -> (file in run_scripts/, run it (True) or print how to use it (False))
SCRIPTS = {"local": ("local.sh", True), "hostfile": ("mpirun_hostfile.sh", True),
           "elastic": ("elastic.sh", True), "slurm": ("slurm.sbatch", False),
           "discover-hosts": ("discover_hosts.sh", False)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    folder = shipped.folder("run_scripts")
    parser.description = (f"Runs one of the launch scripts in {folder} with ARGS (see "
                          f"'hvdtrain launch NAME --help'); slurm and discover-hosts are "
                          f"submitted or passed on by you, so their path is printed.")
    parser.add_argument("script", choices=[*SCRIPTS, "k8s"], metavar="NAME",
                        help=", ".join([*SCRIPTS, "k8s"]))
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the script's arguments, e.g. 'local 2 --preset digits'; "
                             "'NAME --path' prints the script's path")


def run(args: argparse.Namespace) -> int:
    if args.script == "k8s":
        return k8s.main(args.args)
    file, runs = SCRIPTS[args.script]
    path = shipped.folder("run_scripts") / file
    path_only = args.args == ["--path"]  # after NAME, so the script's own flags pass through
    if path_only or not runs:
        usage = {"slurm": f"sbatch --nodes=N --ntasks-per-node=1 {path} [hvdtrain train args]",
                 "discover-hosts": f'hvdtrain launch elastic ... -d "{path} hosts.txt" -- ...'}
        print(path if path_only else f"{path}\nuse: {usage[args.script]}", flush=True)
        return 0
    # The scripts' own messages name the command the user typed.
    os.environ["PROG"] = f"hvdtrain launch {args.script}"
    os.execvp("bash", ["bash", str(path), *args.args])
