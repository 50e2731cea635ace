"""The wrapper's tax: hvdtrain at one rank against plain Keras ``fit`` of the same work, with no
Horovod at all, on the same core.

The plain side is what a user's own single-device script does (shared/plain_job.py). The
hvdtrain side is ``trainer_job.measure`` at one rank: the real Trainer under mpirun, its
distributed optimizer, callbacks and input pipeline. Both are timed by the same step timer
(steps within an epoch; what happens between epochs, a checkpoint say, is not in the figure).
Rounds alternate the order (plain first, then hvdtrain first, ...) so that a drift in the
machine's load falls on both (shared/training_rounds.py: under ``bench all``, the same rounds as
bench scaling's and stacks'); the result is the median over rounds of hvdtrain / plain with its
spread. 1.0 is the ceiling of a wrapper that costs nothing.

The same rounds' 2-rank hvdtrain job also gives the consistency check's cost, which acts only
where there are ranks to compare (shared/check_cost.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.bench import registry
from hvdtrain.bench.shared import (arguments, check_cost, host, plots, report, stats,
                                   targets, training_rounds)
from hvdtrain.bench.shared.workloads import WORKLOADS

SPREAD_LIMIT = stats.SPREAD_LIMIT

BREAKDOWN = ("step_seconds_median", "between_steps_seconds_median")


def record(row: dict[str, Any], side: str, rate: float, raw: dict[str, Any]) -> None:
    """One side's figures in a round's ``row``: samples/s, parameter count, step breakdown."""
    row[side], row[f"{side}_params"] = rate, raw["params"]
    row[f"{side}_step"] = {key: raw[key] for key in BREAKDOWN}


def stack_name(stack: str) -> str:
    """``keras3`` or ``keras2`` from a rank's stack line ('tensorflow X, keras 3.15.1, ...')."""
    keras = stack.split("keras ", 1)[1] if "keras " in stack else "?"
    return f"keras{keras.split('.', 1)[0]}"


# ---------------------------------------------------------------------------------------------
# The driver

TARGET = targets.TAX
PLAN_WORLD_SIZES = (1,)   # the tax is measured at one rank alone
CHECK_RANKS = 2           # the consistency check's cost, where it acts


def ratio_summary(rounds: Sequence[dict[str, float]], top: str = "hvdtrain",
                  bottom: str = "plain") -> dict[str, Any]:
    """``top`` / ``bottom`` (hvdtrain / plain by default) per round, their median and spread,
    and whether that is noise."""
    return stats.ratio_summary([r[top] / r[bottom] for r in rounds], SPREAD_LIMIT)


def request(*, models: Sequence[str], rounds: int = 3, quick: bool = False,
            python: str = sys.executable, other_python: str | None = None
            ) -> training_rounds.Request:
    """The jobs bench tax times: plain fit and hvdtrain at one rank (and at two, for the
    consistency check's cost), on the stack of ``python`` and of ``other_python`` (when
    given), ``rounds`` interleaved rounds per model."""
    return training_rounds.stack_request(
        models=models, rounds=rounds, quick=quick, python=python, other_python=other_python,
        sides=(training_rounds.PLAIN, PLAN_WORLD_SIZES[0], CHECK_RANKS))


def tax_rounds(jobs: dict[str, Any], which: str, rounds: int) -> list[dict[str, Any]]:
    """One stack's rows of a model's first ``rounds`` rounds (``training_rounds.measure``'s):
    plain fit's and hvdtrain's samples/s, what each trained and ran with."""
    rows = []
    for r in jobs["rounds"][:rounds]:
        plain, mine = r[which][training_rounds.PLAIN], r[which][PLAN_WORLD_SIZES[0]]
        row: dict[str, Any] = {"hvdtrain_rank_env": mine["rank_env"]}
        record(row, "plain", plain["samples_per_sec"], plain["raw"])
        record(row, "hvdtrain", mine["total_samples_per_sec"]["median"], mine["raw"][0])
        row["check"] = check_cost.round_shares(r[which][CHECK_RANKS]["raw"])
        rows.append(row)
    return rows


def check_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The consistency check's figures (``check_cost.round_shares``) over the rounds."""
    return {key: stats.summarize([r["check"][key] for r in rows])
            for key in rows[0]["check"]}


def run(out_dir: Path, own: training_rounds.Request,
        source: training_rounds.Request | None = None) -> dict[str, Any]:
    """``own``'s interleaved rounds per model (``request``), read from ``source``'s when given
    (bench all's, which hold them): both stacks' tax, and each stack's plain fit and hvdtrain
    against the other's; written to tax.json/.md/.png (tax-keras2.* and so on when the one
    stack measured is another venv's interpreter)."""
    pythons = dict(own.pythons)
    machine = host.machine(pythons["this"])   # before the work: its load is the machine's own
    versions = {k: host.stack_versions(v) for k, v in pythons.items()}
    measured = training_rounds.measured(source or own)
    results: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    stack_of = {k: measured[own.models[0]]["rounds"][0][k][PLAN_WORLD_SIZES[0]]["stack"]
                for k in pythons}
    for name in own.models:
        workload = WORKLOADS[name]
        rows = {k: tax_rounds(measured[name], k, own.rounds) for k in pythons}
        for which in pythons:
            results.append({"model": name, "stack": stack_name(stack_of[which]),
                            "stack_line": stack_of[which], "which": which,
                            "batch_size": workload.batch_size,
                            "image_shape": list(workload.image_shape),
                            "rounds": rows[which],
                            "load_average_before_each_round":
                                measured[name]["loads"][:own.rounds],
                            "hvdtrain_over_plain": ratio_summary(rows[which]),
                            "consistency_check": check_summary(rows[which])})
        if "other" in pythons:
            comparisons.append({"model": name, **{
                f"{side}_this_over_other": stats.ratio_summary(
                    [a[side] / b[side] for a, b in zip(rows["this"], rows["other"])],
                    SPREAD_LIMIT) for side in ("plain", "hvdtrain")}})
    plan = dataclasses.replace(own.plan, world_sizes=PLAN_WORLD_SIZES)
    result = {"benchmark": "tax", "machine": machine, "stack": stack_of["this"],
              "stacks": {k: {"line": stack_of[k], "name": stack_name(stack_of[k]),
                             "versions": versions[k]} for k in pythons},
              "plan": {"rounds": own.rounds, **asdict(plan)}, "target": TARGET,
              "results": results, "stack_comparisons": comparisons}
    # Another venv's stack alone: tax-keras2.* next to tax.*.
    name = ("tax" if pythons["this"] == sys.executable or "other" in pythons
            else f"tax-{stack_name(stack_of['this'])}")
    report.write_outputs(out_dir, name, result, markdown(result))
    plots.plot_bars(out_dir / f"{name}.png",
                     {model: {f"{r['stack']}: hvdtrain / plain fit":
                              r["hvdtrain_over_plain"]["median"] for r in results
                              if r["model"] == model} for model in own.models},
                     title="hvdtrain at one rank against plain Keras fit",
                     ylabel="samples/s ratio (median over rounds)", reference=1.0,
                     reference_label="no tax")
    return result


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for r in result["results"]:
        plain = [x["plain"] for x in r["rounds"]]
        mine = [x["hvdtrain"] for x in r["rounds"]]
        rows.append([r["model"], r["stack_line"] or r["stack"], r["batch_size"],
                     f"{stats.summarize(plain)['median']:,.2f}",
                     f"{stats.summarize(mine)['median']:,.2f}",
                     stats.ratio_cell(r["hvdtrain_over_plain"], result["target"]),
                     ", ".join(f"{x:.2f}" for x in r["load_average_before_each_round"])])
    lines = [
        f"hvdtrain at 1 rank (mpirun, one core) against plain Keras fit (no Horovod, the same "
        f"core), {result['plan']['rounds']} interleaved rounds; "
        f"{host.machine_line(result['machine'])}. Ratio: median over rounds of hvdtrain / "
        f"plain (spread = (max - min) / median; 'noise' past {SPREAD_LIMIT:.0%}); target: "
        f">= {result['target']:g}.", "",
        report.markdown_table(["model", "stack", "batch", "plain fit samples/s",
                               "hvdtrain samples/s", "hvdtrain / plain",
                               "load before each round"], rows)]
    breakdown = breakdown_rows(result["results"])
    if breakdown:
        lines += ["", "Where a step's time goes, each side's median over its timed steps, then "
                      "the median over rounds: the step (one step's end to the next), and of it "
                      "the time between steps (the fit loop and the callbacks' hooks, outside "
                      "the train function).", "",
                  report.markdown_table(["model", "stack", "plain fit step ms",
                                         "hvdtrain step ms", "plain fit between steps ms",
                                         "hvdtrain between steps ms"], breakdown)]
    lines += check_lines(result)
    if result.get("stack_comparisons"):
        stacks = result["stacks"]
        this, other = stacks["this"]["name"], stacks["other"]["name"]
        lines += ["", f"The same rounds, {this} ({stacks['this']['line']}) over {other} "
                      f"({stacks['other']['line']}): plain fit against plain fit is the "
                      f"TensorFlow/Keras version's own difference, with no hvdtrain and no "
                      f"Horovod; hvdtrain against hvdtrain at one rank (target >= "
                      f"{result['target']:g}).", "",
                  report.markdown_table(
                      ["model", f"plain fit, {this} / {other}", f"hvdtrain, {this} / {other}"],
                      [[c["model"], stats.ratio_cell(c["plain_this_over_other"]),
                        stats.ratio_cell(c["hvdtrain_this_over_other"], result["target"])]
                       for c in result["stack_comparisons"]])]
    return "\n".join(lines)


def check_lines(result: dict[str, Any]) -> list[str]:
    """The consistency check's cost at 2 ranks: a paragraph and a table (none in a result
    from before it was measured with its cadence)."""
    cell = stats.range_cell
    rows = [[r["model"], r["stack"], cell(c["full_seconds"], lambda s: f"{s * 1e3:.1f}"),
             cell(c["full_share"], lambda x: f"{x:.1%}"),
             cell(c["epochs_between"], lambda n: f"{n:.0f}"),
             cell(c["epoch_share"], lambda x: f"{x:.2%}"),
             cell(c["first_epoch_step_share"], lambda x: f"{x:.2%}")]
            for r in result["results"] if "full_seconds" in (c := r.get("consistency_check", {}))]
    if not rows:
        return []
    steps = result["plan"]["steps_per_repeat"] + 1
    return ["", f"The consistency check's cost, in the same rounds' 2-rank hvdtrain jobs (the "
                f"check acts only where there are 2 ranks; the slowest rank's figure, median "
                f"over rounds; hvdtrain/bench/shared/check_cost.py), driven after training "
                f"with the ranks in step: its full comparison at an epoch's end (checksums of "
                f"every trainable variable and an all-gather) and that comparison's share of a "
                f"timed epoch here ({steps} steps); the epochs its cadence trains between full "
                f"comparisons at that epoch length (hvdtrain/distributed/check_cadence.py: "
                f"always at the first epoch's end and the end of training); the check's share "
                f"of a training, each epoch's start (an all-gather) and the full comparison "
                f"once every so many epochs, against {check_cost.TARGET:.1%}; and the first "
                f"epoch's in-graph record of each batch (timed alone) as a share of a step. "
                f"Each: the median over rounds (the lowest to the highest). Off: "
                f"`dist.fit_callbacks(consistency_check=False)`, "
                f"`--set train.consistency_check=false`.", "",
            report.markdown_table(["model", "stack", "full comparison ms",
                                   f"its share of a {steps}-step epoch",
                                   "epochs between full comparisons",
                                   f"share of a training (< {check_cost.TARGET:.1%})",
                                   "first epoch: record's share of a step"], rows)]


def breakdown_rows(results: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """The step breakdown's table rows (milliseconds); none where a round lacks it."""
    rows = []
    for r in results:
        if not all(f"{side}_step" in x for x in r["rounds"] for side in ("plain", "hvdtrain")):
            continue
        cells = [stats.summarize([x[f"{side}_step"][key] * 1e3 for x in r["rounds"]])["median"]
                 for key in BREAKDOWN for side in ("plain", "hvdtrain")]
        rows.append([r["model"], r["stack"], *(f"{ms:.3f}" if ms < 1 else f"{ms:.2f}"
                                                for ms in cells)])
    return rows


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench tax

def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench tax``: its rounds, or bench all's where they hold them; UserError when
    --venv or --other-venv has no Python or a model is unknown."""
    own = request(**arguments.stack_choice(args))
    run(Path(args.out), own, training_rounds.shared_in_all(args, own))


BENCHMARK = registry.Benchmark(
    name="tax", help="hvdtrain at one rank against plain Keras fit of the same work with no "
                     "Horovod (the wrapper's cost), interleaved rounds",
    main=main, add_arguments=arguments.add_stack_arguments, in_all=True,
    title="The wrapper's tax: hvdtrain at one rank against plain Keras fit")
