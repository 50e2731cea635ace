"""``hvdtrain launch NAME``: the launch scripts of run_scripts/ (launchers.SCRIPTS: each
launcher's own, then elastic, slurm and discover-hosts), reachable after a pip install (the
wheel ships them under hvdtrain/shipped/); ``hvdtrain launch k8s``: a Kubeflow MPIJob or
TrainJob that runs the hostfile one (hvdtrain/commands/launch_k8s.py)."""
from __future__ import annotations

import argparse
import os

from hvdtrain.install import shipped
from hvdtrain.commands import launch_k8s
from hvdtrain.launch import launchers

NAME = "launch"
SCRIPTS = launchers.SCRIPTS
HELP = ("run a launch script: "
        + ", ".join(f"{s.name} ({s.help})" for s in SCRIPTS.values() if not s.usage) + "; "
        + " and ".join(s.name for s in SCRIPTS.values() if s.usage)
        + " print theirs, k8s prints a Kubeflow MPIJob or TrainJob ('hvdtrain launch NAME "
          "--help')")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    folder = shipped.folder("run_scripts")
    printed = " and ".join(s.name for s in SCRIPTS.values() if s.usage)
    parser.description = (f"Runs one of the launch scripts in {folder} with ARGS (see "
                          f"'hvdtrain launch NAME --help'); {printed} are submitted or passed "
                          f"on by you, so their path is printed.")
    parser.add_argument("script", choices=[*SCRIPTS, "k8s"], metavar="NAME",
                        help=", ".join([*SCRIPTS, "k8s"]))
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the script's arguments, e.g. 'local 2 --preset digits'; "
                             "'NAME --path' prints the script's path")


def run(args: argparse.Namespace) -> int:
    if args.script == "k8s":
        return launch_k8s.main(args.args)
    script = SCRIPTS[args.script]
    path = shipped.folder("run_scripts") / script.file
    path_only = args.args == ["--path"]  # after NAME, so the script's own flags pass through
    if path_only or script.usage:
        usage = f"\nuse: {script.usage.format(path=path)}" if script.usage and not path_only else ""
        print(f"{path}{usage}", flush=True)
        return 0
    # The scripts' own messages name the command the user typed.
    os.environ["PROG"] = f"hvdtrain launch {args.script}"
    os.execvp("bash", ["bash", str(path), *args.args])
