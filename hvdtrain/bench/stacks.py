"""The two stacks on the same work: hvdtrain on Keras 3 (its own binding: one grouped all-reduce
per step in front of the optimizer) against hvdtrain on Keras 2 (Horovod's DistributedOptimizer),
on the same machine, in the same run.

Each round measures both stacks, in alternating order (A B, then B A, ...), so that a drift in
the machine's load falls on both; each measurement is ``scaling.measure``: a real Trainer on
synthetic data, one core per rank, at 1 and at 2 ranks. Reported per round: samples/s of each
stack at each world size and the all-reduce's cost per step, the time a 2-rank step takes
beyond a 1-rank step at the same per-rank batch (mostly the all-reduce of the gradients and the
wait for the slower rank). The result is the median over rounds of the per-round ratio
(this stack / the other) with its spread.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hvdtrain.bench import common, registry, scaling
from hvdtrain.errors import UserError

SPREAD_LIMIT = 0.10  # a ratio whose rounds spread wider than this is noise, not a result


def step_ms(row: dict[str, Any]) -> float:
    """One step's wall time at this world size, from the median per-rank rate."""
    return 1000 * row["batch_size_per_rank"] / row["per_rank_samples_per_sec"]["median"]


def allreduce_cost_ms(one: dict[str, Any], two: dict[str, Any]) -> float:
    """The time a 2-rank step takes beyond a 1-rank step at the same per-rank batch."""
    return step_ms(two) - step_ms(one)


def measure_stack(python: str, workload: scaling.Workload, plan: scaling.Plan,
                  work_dir: Path) -> dict[str, Any]:
    """Samples per second at 1 and 2 ranks on the stack of ``python``, the all-reduce's cost per
    step derived from them, and the stack's versions."""
    one, two = (scaling.measure(workload, n, plan, work_dir, python=python) for n in (1, 2))
    return {"samples_per_sec_1": one["total_samples_per_sec"]["median"],
            "samples_per_sec_2": two["total_samples_per_sec"]["median"],
            "allreduce_ms_per_step": allreduce_cost_ms(one, two),
            "stack": one["stack"]}


def ratios(rounds: list[dict[str, dict]], this: str, other: str) -> dict[str, dict]:
    """Per figure: the median over rounds of this / other, its spread, and whether the spread
    is small enough to call it a result."""
    out = {}
    for key in ("samples_per_sec_1", "samples_per_sec_2", "allreduce_ms_per_step"):
        per_round = [r[this][key] / r[other][key] for r in rounds]
        summary = common.summarize(per_round)
        out[key] = {**summary, "per_round": per_round,
                    "noise": summary["spread"] > SPREAD_LIMIT}
    return out


def run(out_dir: Path, *, other_python: str, model: str = "mlp", rounds: int = 5,
        quick: bool = False, steps: int | None = None) -> dict[str, Any]:
    """``steps``: timed steps per repeat (default: bench scaling's); a small model's steps take
    a millisecond or two, too short to time in a few."""
    machine = common.machine()   # before the work: its load is the machine's own
    plan = scaling.QUICK if quick else scaling.FULL
    if steps:
        plan = dataclasses.replace(plan, steps_per_repeat=steps)
    workload = scaling.WORKLOADS[model]
    pythons = {"this": sys.executable, "other": other_python}
    measured: list[dict[str, dict]] = []
    loads = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for i in range(rounds):
            order = ("this", "other") if i % 2 == 0 else ("other", "this")
            loads.append(common.load_average())
            row = {}
            for which in order:
                common.say(f"stacks: round {i + 1}/{rounds}, {which} stack ({model})...")
                row[which] = measure_stack(pythons[which], workload, plan, Path(tmp))
            measured.append(row)
    result = {"benchmark": "stacks", "machine": machine, "model": model,
              "plan": {"rounds": rounds, **asdict(plan)},
              "stacks": {k: measured[0][k]["stack"] for k in pythons},
              "load_average_before_each_round": loads, "rounds": measured,
              "ratio_this_over_other": ratios(measured, "this", "other"),
              "medians": {k: {key: statistics.median(r[k][key] for r in measured)
                              for key in ("samples_per_sec_1", "samples_per_sec_2",
                                          "allreduce_ms_per_step")} for k in pythons}}
    common.write_outputs(out_dir, f"stacks-{model}", result, markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    stacks, medians, ratio = result["stacks"], result["medians"], result["ratio_this_over_other"]
    names = {"samples_per_sec_1": "samples/s, 1 rank", "samples_per_sec_2": "samples/s, 2 ranks",
             "allreduce_ms_per_step": "all-reduce cost per step, ms"}
    rows = []
    for key, label in names.items():
        r = ratio[key]
        rows.append([label, f"{medians['this'][key]:,.2f}", f"{medians['other'][key]:,.2f}",
                     f"{r['median']:.3f} (spread {r['spread']:.0%})"
                     + (" noise" if r["noise"] else "")])
    loads = ", ".join(f"{x:.2f}" for x in result["load_average_before_each_round"])
    return "\n".join([
        f"{result['model']}, {result['plan']['rounds']} interleaved rounds, one core per rank; "
        f"A = {stacks['this']}, B = {stacks['other']}; load average before each round: "
        f"{loads}. Ratios: median over rounds of A / B (spread = (max - min) / median; "
        f"'noise' past {SPREAD_LIMIT:.0%}).", "",
        common.markdown_table(["figure", "A (median)", "B (median)", "A / B"], rows)])



# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench stacks

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench stacks' options."""
    parser.add_argument("--other-venv", type=Path, required=True,
                        help="the other stack's virtualenv (e.g. .venv-keras2)")
    parser.add_argument("--model", default="mlp", help="mobilenetv2, resnet_small or mlp "
                                                       "(default mlp)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per repeat (default 8; more for a small model)")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench stacks``; UserError when --other-venv has no Python or --model is not
    a benchmark model."""
    other = args.other_venv / "bin" / "python"
    if not other.exists():
        raise UserError(f"{other} not found: --other-venv takes a virtualenv made by "
                        f"'make install STACK=...', e.g. .venv-keras2")
    scaling.model_names(args.model, args.quick)
    run(Path(args.out), other_python=str(other), model=args.model, rounds=args.rounds,
        quick=args.quick, steps=args.steps)


BENCHMARK = registry.Benchmark(
    name="stacks", help="this stack against another (e.g. Keras 3 against Keras 2), "
                        "interleaved rounds of 1- and 2-rank training",
    main=main, add_arguments=add_arguments)
