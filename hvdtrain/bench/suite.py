"""``hvdtrain bench``: running the benchmark the command line chose (hvdtrain.commands.bench
parses it), and ``all``, which runs every one and rewrites the results block of
benchmarks/README.md."""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from hvdtrain.bench import common, registry
from hvdtrain.errors import UserError

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def run(args: argparse.Namespace) -> int:
    """The benchmark ``args.benchmark`` with its options in ``args``; 0, or 1 when one of its
    jobs failed (one line on stderr). ``args.command_line``: what the user typed, quoted in
    the README block of ``bench all`` (None: called from Python)."""
    started = time.monotonic()
    try:
        registry.find(args.benchmark).main(args)
    except common.BenchError as e:
        print(f"hvdtrain bench: {e}", file=sys.stderr, flush=True)
        return 1
    common.say(f"bench {args.benchmark}: done in {time.monotonic() - started:.0f}s, "
               f"results in {Path(args.out)}")
    return 0


# ---------------------------------------------------------------------------------------------
# hvdtrain bench all

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench all's options: those of the benchmarks it runs (where they say so), --readme."""
    for bench in registry.in_all():
        if bench.options_in_all:
            bench.add_arguments(parser)
    parser.add_argument("--readme", type=Path, default=None,
                        help="rewrite the block between the bench markers of this file")


def run_all(args: argparse.Namespace) -> None:
    """Every benchmark of ``registry.in_all()`` with ``args`` over its own defaults, then the
    results block of --readme."""
    for bench in registry.in_all():
        bench.main(argparse.Namespace(**{**vars(registry.defaults(bench)), **vars(args)}))
    if args.readme:
        update_readme(args.readme, Path(args.out), args.command_line or "hvdtrain bench all")


BENCHMARK = registry.Benchmark(
    name="all", help="all {count}, then the results block of --readme", main=run_all,
    add_arguments=add_arguments)


def results_block(out: Path, readme: Path, command: str) -> str:
    """The README's results: the machine, the command, every table and plot."""
    import json
    machine = json.loads((out / "scaling.json").read_text())["machine"]
    rel = out.resolve().relative_to(readme.resolve().parent) \
        if out.resolve().is_relative_to(readme.resolve().parent) else out.resolve()
    parts = [BEGIN, f"Measured with `{command}` on: {common.machine_line(machine)}.", ""]
    for bench in registry.in_all():
        name = bench.name
        parts += [f"### {bench.title}", "", (out / f"{name}.md").read_text().rstrip(), "",
                  f"![{name}]({rel / (name + '.png')})", ""]
    parts.append(END)
    return "\n".join(parts)


def replace_block(readme: Path, block: str) -> None:
    """Puts ``block`` in place of the text between the bench markers of ``readme``."""
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise UserError(f"{readme} has no {BEGIN} ... {END} block to rewrite")
    readme.write_text(pattern.sub(lambda _: block, text))


def update_readme(readme: Path, out: Path, command: str) -> None:
    """Rewrites the results block of ``readme`` from the results in ``out``."""
    replace_block(readme, results_block(out, readme, command))
    common.say(f"bench all: rewrote the results block of {readme}")
