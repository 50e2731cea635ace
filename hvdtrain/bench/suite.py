"""``hvdtrain bench``: running the benchmark the command line chose (hvdtrain.commands.bench
parses it), and ``all``, which runs every one and rewrites the results block of
benchmarks/README.md."""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from hvdtrain.launch import placement
from hvdtrain.errors import UserError
from hvdtrain.bench import registry
from hvdtrain.bench.shared import host, jobs, report

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def run(args: argparse.Namespace) -> int:
    """The benchmark ``args.benchmark`` with its options in ``args``; 0, or 1 when one of its
    jobs failed (one line on stderr). ``args.command_line``: what the user typed, quoted in
    the README block of ``bench all`` (None: called from Python)."""
    started = time.monotonic()
    try:
        registry.find(args.benchmark).main(args)
    except jobs.BenchError as e:
        print(f"hvdtrain bench: {e}", file=sys.stderr, flush=True)
        return 1
    if placement.launcher_rank() == 0:   # bench cluster runs on every rank of a job
        report.say(f"bench {args.benchmark}: done in {time.monotonic() - started:.0f}s, "
                   f"results in {Path(args.out)}")
    return 0


# ---------------------------------------------------------------------------------------------
# hvdtrain bench all

class _FirstDefinition:
    """``parser`` for bench all: an option that several benchmarks define (--models, --rounds,
    --other-venv) is added once, by the first; each benchmark reads it (None: its own
    default)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_argument(self, *names: str, **options: Any) -> None:
        if not any(n in self.parser._option_string_actions for n in names):
            self.parser.add_argument(*names, **options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench all's options: those of the benchmarks it runs (where they say so), --readme."""
    for bench in registry.in_all():
        if bench.options_in_all:
            bench.add_arguments(_FirstDefinition(parser))  # type: ignore[arg-type]
    parser.add_argument("--readme", type=Path, default=None,
                        help="rewrite the block between the bench markers of this file")


def options_in_all(bench: registry.Benchmark, args: argparse.Namespace) -> argparse.Namespace:
    """``bench``'s options under bench all: ``args`` (bench all's) over its own defaults, and
    ``in_all`` (some benchmarks share work, or skip what bench all was not given)."""
    return argparse.Namespace(**{**vars(registry.defaults(bench)), **vars(args), "in_all": True})


def run_all(args: argparse.Namespace) -> None:
    """Every benchmark of ``registry.in_all()`` with ``args`` over its own defaults, then the
    results block of --readme; each benchmark's wall time into all.json."""
    started = time.monotonic()
    timings: list[dict[str, Any]] = []
    for bench in registry.in_all():
        begun = time.monotonic()
        bench.main(options_in_all(bench, args))
        timings.append({"benchmark": bench.name, "seconds": time.monotonic() - begun})
        report.say(f"bench all: {bench.name} took {timings[-1]['seconds'] / 60:.1f} min")
    total = time.monotonic() - started
    report.write_outputs(Path(args.out), "all", {
        "benchmark": "all", "command": args.command_line or "hvdtrain bench all",
        "quick": bool(getattr(args, "quick", False)), "seconds": total, "timings": timings,
        "budget_seconds": BUDGET_S},
        timings_markdown(timings, total, bool(getattr(args, "quick", False))))
    if args.readme:
        update_readme(args.readme, Path(args.out), args.command_line or "hvdtrain bench all")


# issue 28: 'make bench' (bench all with every comparison) within 30 minutes on the 2-core machine.
BUDGET_S = 30 * 60


def timings_markdown(timings: list[dict[str, Any]], total: float, quick: bool = False) -> str:
    cells = ", ".join(f"{t['benchmark']} {t['seconds'] / 60:.1f}" for t in timings)
    if quick:
        return f"bench all --quick took {total / 60:.1f} min ({cells}; minutes)."
    return (f"bench all took {total / 60:.1f} min ({cells}; minutes): "
            f"{'within' if total <= BUDGET_S else 'over'} the {BUDGET_S // 60}-minute budget.")


BENCHMARK = registry.Benchmark(
    name="all", help="all {count}, then the results block of --readme", main=run_all,
    add_arguments=add_arguments)


def results_block(out: Path, readme: Path, command: str) -> str:
    """The README's results, from the result files alone: the command, the time bench all
    took, then per benchmark its NAME.md and NAME.png (each NAME.md names its own machine and
    stack), or a line saying it wrote none."""
    rel = out.resolve().relative_to(readme.resolve().parent) \
        if out.resolve().is_relative_to(readme.resolve().parent) else out.resolve()
    parts = [BEGIN, f"Measured with `{command}`; under each title, the machine, stack and load "
                    f"its benchmark started with (its JSON holds every round).", ""]
    if (out / "all.md").exists():
        parts += [(out / "all.md").read_text().strip(), ""]
    for bench in registry.in_all():
        name = bench.name
        parts += [f"### {bench.title}", ""]
        if not (out / f"{name}.md").exists():
            parts += [f"Not run (no `{name}.md` in `{rel}`).", ""]
            continue
        parts += [f"On: {measured_on(out / f'{name}.json')}.", "",
                  (out / f"{name}.md").read_text().rstrip(), ""]
        if (out / f"{name}.png").exists():
            parts += [f"![{name}]({rel / (name + '.png')})", ""]
    parts.append(END)
    return "\n".join(parts)


def measured_on(path: Path) -> str:
    """The machine line of a result file (``host.machine_line``), or why there is none."""
    import json
    try:
        return host.machine_line(json.loads(path.read_text())["machine"])
    except (OSError, ValueError, KeyError):
        return f"no machine recorded ({path.name} missing or without one)"


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
    report.say(f"bench all: rewrote the results block of {readme}")
