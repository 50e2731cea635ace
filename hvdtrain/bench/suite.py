"""``hvdtrain bench``: the command line of the benchmarks, and ``all``, which runs every one
and rewrites the results block of benchmarks/README.md."""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

from hvdtrain import launching
from hvdtrain.bench import common
from hvdtrain.errors import UserError

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
DEFAULT_OUT = "benchmarks/results"


def parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """``hvdtrain bench``'s own command line (the CLI imports this module for bench alone)."""
    bench = parser_class(
        prog="hvdtrain bench",
        description="Measures how hvdtrain scales on this machine. Each benchmark launches its "
                    "own jobs (mpirun, horovodrun, tf.distribute processes): run it in one "
                    "plain process, not under a launcher.")
    kinds = bench.add_subparsers(dest="benchmark", required=True, parser_class=parser_class)
    helps = {"scaling": "throughput and weak-scaling efficiency against world size",
             "allreduce": "all-reduce bus bandwidth against message size (Horovod, MPI, Gloo)",
             "peers": "hvdtrain against MultiWorkerMirroredStrategy, ParameterServerStrategy "
                      "and one process, on digits",
             "project": "ring-model efficiency at 8, 64, 512 ranks from the measured figures",
             "input": "one rank's input pipeline against its training step, every source "
                      "and bundled model (samples/s)",
             "all": "all five, then the results block of --readme",
             "stacks": "this stack against another (e.g. Keras 3 against Keras 2), interleaved "
                       "rounds of 1- and 2-rank training"}
    for name, text in helps.items():
        p = kinds.add_parser(name, help=text, description=text)
        p.add_argument("--out", default=DEFAULT_OUT,
                       help=f"directory for NAME.json, NAME.md and PNGs (default {DEFAULT_OUT})")
        if name != "project":
            p.add_argument("--quick", action="store_true",
                           help="a smoke test: fewer sizes, steps and epochs (CI)")
        if name in ("scaling", "all"):
            p.add_argument("--models", default=None,
                           help="comma list of mobilenetv2, resnet_small, mlp (default: "
                                "mobilenetv2,resnet_small; --quick: mlp)")
            p.add_argument("--world-sizes", default="1,2", help="comma list (default 1,2)")
            p.add_argument("--launcher", choices=launching.LAUNCHERS, default="mpi",
                           help="mpi (mpirun --bind-to core, default) or gloo (horovodrun)")
            p.add_argument("--horovod-synthetic", metavar="PATH", type=Path,
                           help="Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark"
                                ".py: also compare with it (skipped when absent)")
        if name == "input":
            p.add_argument("--threads", type=int, default=1,
                           help="the rank's cores and intra-op threads (default 1: one core "
                                "per rank, as bench scaling)")
        if name in ("project", "all"):
            p.add_argument("--link-gbitps", type=float, default=25.0,
                           help="cluster link bandwidth for the projection (default 25)")
            p.add_argument("--latency-us", type=float, default=10.0,
                           help="cluster latency per hop for the projection (default 10)")
        if name == "all":
            p.add_argument("--readme", type=Path, default=None,
                           help="rewrite the block between the bench markers of this file")
        if name == "stacks":
            p.add_argument("--other-venv", type=Path, required=True,
                           help="the other stack's virtualenv (e.g. .venv-keras2)")
            p.add_argument("--model", default="mlp", help="mobilenetv2, resnet_small or mlp "
                                                          "(default mlp)")
            p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
            p.add_argument("--steps", type=int, default=None,
                           help="timed steps per repeat (default 8; more for a small model)")
    return bench


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise UserError(f"{what}={text!r}: expected positive integers such as 1,2")
    return values


def _threads(threads: int) -> int:
    if not 1 <= threads <= len(os.sched_getaffinity(0)):
        raise UserError(f"--threads={threads}: expected 1 to the {len(os.sched_getaffinity(0))} "
                        f"cores this process may use")
    return threads


def _models(text: str | None, quick: bool) -> list[str]:
    from hvdtrain.bench.scaling import WORKLOADS
    names = (text or ("mlp" if quick else "mobilenetv2,resnet_small")).split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise UserError(f"unknown benchmark model {unknown[0]!r}; choose from "
                        f"{', '.join(WORKLOADS)}")
    return names


def main(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    """``hvdtrain bench ARGV``."""
    return run(parser(parser_class).parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from hvdtrain.bench import allreduce, peers, project, scaling, stacks, versus_horovod
    from hvdtrain.bench import input as input_bench
    out = Path(args.out)
    started = time.monotonic()
    kind = args.benchmark
    quick = getattr(args, "quick", False)
    try:
        if kind == "stacks":
            other = args.other_venv / "bin" / "python"
            if not other.exists():
                raise UserError(f"{other} not found: --other-venv takes a virtualenv made by "
                                f"'make install STACK=...', e.g. .venv-keras2")
            _models(args.model, quick)
            stacks.run(out, other_python=str(other), model=args.model, rounds=args.rounds,
                       quick=quick, steps=args.steps)
        if kind in ("scaling", "all"):
            base = scaling.QUICK if quick else scaling.FULL
            plan = scaling.Plan(world_sizes=_ints(args.world_sizes, "--world-sizes"),
                                warmup_epochs=base.warmup_epochs, repeats=base.repeats,
                                steps_per_repeat=base.steps_per_repeat, launcher=args.launcher)
            versus = versus_horovod.run(args.horovod_synthetic, quick=quick)
            scaling.run(out, models=_models(args.models, quick), plan=plan, versus=versus)
        if kind in ("allreduce", "all"):
            allreduce.run(out, quick=quick)
        if kind in ("peers", "all"):
            peers.run(out, quick=quick)
        if kind in ("project", "all"):
            project.run(out, link_gbitps=args.link_gbitps, latency_us=args.latency_us)
        if kind in ("input", "all"):
            input_bench.run(out, quick=quick, threads=_threads(getattr(args, "threads", 1)))
    except common.BenchError as e:
        print(f"hvdtrain bench: {e}", file=sys.stderr, flush=True)
        return 1
    if kind == "all" and args.readme:
        command = (" ".join(["hvdtrain bench", *map(shlex.quote, sys.argv[2:])])
                   if Path(sys.argv[0]).name == "hvdtrain" else "hvdtrain bench all")
        update_readme(args.readme, out, command)
    common.say(f"bench {kind}: done in {time.monotonic() - started:.0f}s, results in {out}")
    return 0


def results_block(out: Path, readme: Path, command: str) -> str:
    """The README's results: the machine, the command, every table and plot."""
    import json
    machine = json.loads((out / "scaling.json").read_text())["machine"]
    rel = out.resolve().relative_to(readme.resolve().parent) \
        if out.resolve().is_relative_to(readme.resolve().parent) else out.resolve()
    parts = [BEGIN, f"Measured with `{command}` on: {common.machine_line(machine)}.", ""]
    for name, title in [("scaling", "Throughput against world size"),
                        ("allreduce", "All-reduce bus bandwidth"),
                        ("peers", "hvdtrain against tf.distribute's strategies"),
                        ("project", "Projection past this machine"),
                        ("input", "Input pipeline against the training step")]:
        parts += [f"### {title}", "", (out / f"{name}.md").read_text().rstrip(), "",
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
    replace_block(readme, results_block(out, readme, command))
    common.say(f"bench all: rewrote the results block of {readme}")
