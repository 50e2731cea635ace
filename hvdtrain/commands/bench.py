"""``hvdtrain bench NAME``: the benchmarks of hvdtrain.bench.registry, one subcommand each."""
from __future__ import annotations

import argparse

from hvdtrain.commands.parsing import Parser

NAME = "bench"
HELP = ("scaling benchmarks: figures as JSON, Markdown tables and PNG plots ('hvdtrain bench "
        "--help')")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hvdtrain.bench import registry  # the benchmarks load for this command alone
    parser.description = (
        "Measures how hvdtrain scales on this machine. Each benchmark launches its own jobs "
        "(mpirun, horovodrun, tf.distribute processes): run it in one plain process, not under "
        "a launcher.")
    registry.add_parsers(parser, Parser)


def run(args: argparse.Namespace) -> int:
    from hvdtrain.bench import suite  # launches its own jobs: no Horovod in this process
    return suite.run(args)
