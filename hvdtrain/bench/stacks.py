"""The two stacks on the same work: hvdtrain on Keras 3 (its own binding: one grouped all-reduce
per step in front of the optimizer) against hvdtrain on Keras 2 (Horovod's DistributedOptimizer),
on the same machine, in the same run.

Each round measures both stacks, in alternating order (A B, then B A, ...), so that a drift in
the machine's load falls on both (shared/training_rounds.py: under ``bench all``, the same rounds
as bench scaling's and tax's); each measurement is ``trainer_job.measure``: a real Trainer on
synthetic data, one core per rank, at 1 and at 2 ranks. Reported per round: samples/s of each
stack at each world size; the all-reduce's cost per step, the time a 2-rank step takes
beyond a 1-rank step at the same per-rank batch (mostly the all-reduce of the gradients and the
wait for the slower rank); and each stack's weak-scaling efficiency, its 2-rank rate over twice
its 1-rank rate of the same round (bench scaling's, per round). The result is the median over
rounds of the per-round ratio (this stack / the other) with its spread.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.errors import UserError
from hvdtrain.bench import registry
from hvdtrain.bench.shared import (arguments, host, plans, plots, report, stats, steps, targets,
                                   training_rounds)
from hvdtrain.bench.shared.workloads import model_names

SPREAD_LIMIT = stats.SPREAD_LIMIT
TARGET = targets.STACKS
FIGURES = ("samples_per_sec_1", "samples_per_sec_2", "allreduce_ms_per_step", "efficiency_2")
WORLD_SIZES = (1, 2)


def step_ms(row: dict[str, Any]) -> float:
    """One step's wall time at this world size, from the median per-rank rate."""
    return 1000 * row["batch_size_per_rank"] / row["per_rank_samples_per_sec"]["median"]


def allreduce_cost_ms(one: dict[str, Any], two: dict[str, Any]) -> float:
    """The time a 2-rank step takes beyond a 1-rank step at the same per-rank batch."""
    return step_ms(two) - step_ms(one)


def stack_figures(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """One stack's figures of one round from its 1- and 2-rank jobs (``trainer_job.measure``'s
    rows): samples per second at each, the all-reduce's cost per step and the weak-scaling
    efficiency derived from them, and the stack's versions."""
    rate_1, rate_2 = (row["total_samples_per_sec"]["median"] for row in (one, two))
    return {"samples_per_sec_1": rate_1, "samples_per_sec_2": rate_2,
            "allreduce_ms_per_step": allreduce_cost_ms(one, two),
            "efficiency_2": steps.weak_scaling_efficiency(rate_2, 2, rate_1),
            "stack": one["stack"]}


def ratios(rounds: list[dict[str, dict]], this: str, other: str) -> dict[str, dict]:
    """Per figure: the median over rounds of this / other, its spread, and whether the spread
    is small enough to call it a result."""
    return {key: stats.ratio_summary([r[this][key] / r[other][key] for r in rounds],
                                      SPREAD_LIMIT) for key in FIGURES}


def model_result(name: str, jobs: dict[str, Any], stacks: Sequence[str],
                 rounds: int) -> dict[str, Any]:
    """One model's first ``rounds`` interleaved rounds of both stacks (``jobs``:
    ``training_rounds.measure``'s for that model)."""
    measured = [{k: stack_figures(r[k][1], r[k][2]) for k in stacks}
                for r in jobs["rounds"][:rounds]]
    return {"model": name, "stacks": {k: measured[0][k]["stack"] for k in stacks},
            "load_average_before_each_round": jobs["loads"][:rounds], "rounds": measured,
            "ratio_this_over_other": ratios(measured, "this", "other"),
            # Each stack's 2-rank efficiency against its own 1-rank rate of the same round.
            "efficiency_2": {k: stats.ratio_summary([r[k]["efficiency_2"] for r in measured],
                                                     SPREAD_LIMIT) for k in stacks},
            "medians": {k: {key: statistics.median(r[k][key] for r in measured)
                            for key in FIGURES} for k in stacks}}


def request(*, other_python: str, models: Sequence[str] = ("mlp",), rounds: int = 3,
            quick: bool = False, steps: int | None = None) -> training_rounds.Request:
    """The jobs bench stacks times: hvdtrain at 1 and 2 ranks on this stack and on the one of
    ``other_python``, ``rounds`` interleaved rounds per model. ``steps``: timed steps per
    repeat (default: bench scaling's); a small model's steps take a millisecond or two, too
    short to time in a few."""
    plan = plans.QUICK if quick else plans.FULL
    if steps:
        plan = dataclasses.replace(plan, steps_per_repeat=steps)
    return training_rounds.Request(
        models=tuple(models), pythons=(("this", sys.executable), ("other", other_python)),
        plan=plan, rounds=rounds, sides=WORLD_SIZES)


def run(out_dir: Path, own: training_rounds.Request,
        source: training_rounds.Request | None = None) -> dict[str, Any]:
    """Every model of ``own`` (``request``) in turn, its rounds read from ``source``'s when
    given (bench all's, which hold them), written to stacks.json/.md/.png."""
    machine = host.machine()   # before the work: its load is the machine's own
    pythons = dict(own.pythons)
    measured = training_rounds.measured(source or own)
    results = [model_result(m, measured[m], list(pythons), own.rounds) for m in own.models]
    result = {"benchmark": "stacks", "machine": machine,
              "versions": {k: host.stack_versions(v) for k, v in pythons.items()},
              "plan": {"rounds": own.rounds,
                       **asdict(dataclasses.replace(own.plan, world_sizes=WORLD_SIZES))},
              "target": TARGET,
              "results": results}
    report.write_outputs(out_dir, "stacks", result, markdown(result))
    plots.plot_bars(out_dir / "stacks.png",
                     {r["model"]: {f"{n} rank(s)": r["ratio_this_over_other"][
                         f"samples_per_sec_{n}"]["median"] for n in (1, 2)} for r in results},
                     title="This stack over the other (samples/s, median over rounds)",
                     ylabel="ratio", reference=TARGET, reference_label=f"target {TARGET:g}")
    return result


def efficiency_cell(efficiency: dict[str, Any], with_target: bool) -> str:
    """A stack's 2-rank efficiency over the rounds: its median and spread, flagged as noise
    above the ceiling only noise reaches, and with the verdict against the target."""
    if efficiency["median"] > targets.EFFICIENCY_CEILING:
        return f"{stats.ratio_text(efficiency)}: above {targets.EFFICIENCY_CEILING}, noise"
    if not with_target:
        return stats.ratio_cell(efficiency)
    return stats.ratio_cell(efficiency, targets.EFFICIENCY)


def markdown(result: dict[str, Any]) -> str:
    names = {"samples_per_sec_1": "samples/s, 1 rank", "samples_per_sec_2": "samples/s, 2 ranks",
             "allreduce_ms_per_step": "all-reduce cost per step, ms"}
    parts = []
    for model in result["results"]:
        stacks, medians = model["stacks"], model["medians"]
        rows = []
        for key, label in names.items():
            r = model["ratio_this_over_other"][key]
            target = result["target"] if key.startswith("samples") else None
            rows.append([label, f"{medians['this'][key]:,.2f}", f"{medians['other'][key]:,.2f}",
                         stats.ratio_cell(r, target)])
        if "efficiency_2" in model:
            rows.append(["weak-scaling efficiency, 2 ranks (target for A)",
                         *(efficiency_cell(model["efficiency_2"][k], k == "this")
                           for k in ("this", "other")),
                         stats.ratio_cell(model["ratio_this_over_other"]["efficiency_2"])])
        loads = ", ".join(f"{x:.2f}" for x in model["load_average_before_each_round"])
        parts += [
            f"{model['model']}, {result['plan']['rounds']} interleaved rounds, one core per "
            f"rank; A = {stacks['this']}, B = {stacks['other']}; load average before each "
            f"round: {loads}. Ratios: median over rounds of A / B (spread = (max - min) / "
            f"median; 'noise' past {SPREAD_LIMIT:.0%}: the figure does not count); target for "
            f"samples/s: A / B >= {result['target']:g}.", "",
            report.markdown_table(["figure", "A (median)", "B (median)", "A / B"], rows), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench stacks

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench stacks' options (bench all's too)."""
    arguments.add_other_venv(parser)
    arguments.add_models(parser, "--model")
    arguments.add_rounds(parser, f"interleaved rounds (default {arguments.ROUNDS}; --quick: "
                                 f"{arguments.QUICK_ROUNDS})")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per repeat (default 8; more for a small model)")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench stacks``; UserError when --other-venv has no Python or a model is not
    a benchmark model (bench all without --other-venv: skipped, said so)."""
    other = arguments.venv_python(args.other_venv, "--other-venv")
    if other is None:
        if getattr(args, "in_all", False):
            report.say("stacks: skipped (no --other-venv: the other stack's virtualenv)")
            return
        raise UserError("bench stacks needs --other-venv, e.g. .venv-keras2")
    own = request(other_python=other, models=model_names(args.models, args.quick),
                  rounds=arguments.rounds(args), quick=args.quick, steps=args.steps)
    run(Path(args.out), own, training_rounds.shared_in_all(args, own))


BENCHMARK = registry.Benchmark(
    name="stacks", help="this stack against another (e.g. Keras 3 against Keras 2), "
                        "interleaved rounds of 1- and 2-rank training",
    main=main, add_arguments=add_arguments, in_all=True,
    title="Keras 3 against Keras 2 (this stack against --other-venv's)")
