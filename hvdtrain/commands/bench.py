"""``hvdtrain bench NAME``: the benchmarks of hvdtrain.bench.registry, one subcommand each.

The benchmarks are hvdtrain's subpackage ``hvdtrain.bench``; this module is the one place the
rest of hvdtrain reaches them, and it imports them only when ``hvdtrain bench`` is the command
run.
"""
from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from hvdtrain.commands.parsing import Parser

NAME = "bench"
HELP = ("scaling benchmarks: figures as JSON, Markdown tables and PNG plots ('hvdtrain bench "
        "--help')")


def _bench_module(name: str) -> ModuleType:
    """hvdtrain.bench.NAME, loaded when ``hvdtrain bench`` runs (not at the CLI's import)."""
    return importlib.import_module(f"hvdtrain.bench.{name}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    registry = _bench_module("registry")   # the benchmarks load for this command alone
    parser.description = (
        "Measures how hvdtrain scales on this machine. Each benchmark launches its own jobs "
        "(mpirun, horovodrun, tf.distribute processes): run it in one plain process, not under "
        "a launcher; but for 'bench cluster', which runs inside the ranks your launcher starts "
        "across your hosts.")
    registry.add_parsers(parser, Parser)


def run(args: argparse.Namespace) -> int:
    # Launches its own jobs, no Horovod in this process; but for bench cluster, a rank of the
    # user's job.
    return int(_bench_module("suite").run(args))
