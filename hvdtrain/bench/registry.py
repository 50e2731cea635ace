"""The benchmarks of ``hvdtrain bench``, in one table.

Each benchmark is a module of this package that defines ``BENCHMARK = Benchmark(...)``: its
name, help line, arguments, run function and whether ``bench all`` runs it. A benchmark module
imports no other benchmark: what several share is in ``hvdtrain.bench.shared``. ``MODULES``
lists those modules; the bench parser (its choices, help and arguments), ``bench all`` and the
results block it writes are drawn from it. How to add one: docs/layout.md.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Callable

# hvdtrain.bench.MODULE of every benchmark, in the order of 'hvdtrain bench --help' and of the
# runs of 'bench all'. The modules load when the bench parser is built, never before.
MODULES = ("scaling", "tax", "allreduce", "peers", "project", "input", "suite", "stacks", "ops",
           "phases", "cluster", "migration", "network")
DEFAULT_OUT = "benchmarks/results"
_COUNTS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A benchmark without options of its own (beyond --out and --quick)."""


@dataclass(frozen=True)
class Benchmark:
    """One ``hvdtrain bench NAME``."""
    name: str
    # Its line in 'hvdtrain bench --help' and its own --help's description; "{count}" stands
    # for the number of benchmarks 'bench all' runs, in words.
    help: str
    # Measures, writes NAME.json, NAME.md and plots into args.out, and says what it did; a
    # failed job raises common.BenchError, a bad option UserError.
    main: Callable[[argparse.Namespace], None]
    # Its options beyond --out and --quick, which every benchmark gets.
    add_arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    quick: bool = True            # takes --quick (a smoke test: fewer sizes, steps, epochs)
    # Run by 'bench all' (which then needs its title).
    in_all: bool = False
    # The title its NAME.md and NAME.png go under in the README block 'bench all' writes.
    title: str = ""
    # 'bench all' takes its options too (False: bench all runs it with their defaults).
    options_in_all: bool = True

    def __post_init__(self) -> None:
        if self.in_all and not self.title:
            raise ValueError(f"benchmark {self.name!r} is in bench all without a title for "
                             f"its results")


def benchmarks() -> list[Benchmark]:
    """Every benchmark of ``MODULES``, in its order (imports their modules)."""
    return [importlib.import_module(f"hvdtrain.bench.{module}").BENCHMARK for module in MODULES]


def in_all() -> list[Benchmark]:
    """The benchmarks ``bench all`` runs, in the order it runs them."""
    return [bench for bench in benchmarks() if bench.in_all]


def find(name: str) -> Benchmark:
    """The benchmark called ``name`` (a choice the bench parser accepted)."""
    return next(bench for bench in benchmarks() if bench.name == name)


def add_common_arguments(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    """--out, and --quick where the benchmark takes it: the options every benchmark shares."""
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"directory for NAME.json, NAME.md and PNGs (default {DEFAULT_OUT})")
    if bench.quick:
        parser.add_argument("--quick", action="store_true",
                            help="a smoke test: fewer sizes, steps and epochs (CI)")
    bench.add_arguments(parser)


def add_parsers(parser: argparse.ArgumentParser,
                parser_class: type[argparse.ArgumentParser]) -> None:
    """One sub-command of ``parser`` (hvdtrain bench) per benchmark, as ``parser_class``; the
    name chosen lands in ``args.benchmark``."""
    kinds = parser.add_subparsers(dest="benchmark", required=True, parser_class=parser_class)
    count = _COUNTS[len(in_all())]
    for bench in benchmarks():
        text = bench.help.format(count=count)
        add_common_arguments(kinds.add_parser(bench.name, help=text, description=text), bench)


def defaults(bench: Benchmark) -> argparse.Namespace:
    """``bench``'s options at their defaults, as its own command line would parse none."""
    parser = argparse.ArgumentParser(add_help=False)
    add_common_arguments(parser, bench)
    return parser.parse_args([])
