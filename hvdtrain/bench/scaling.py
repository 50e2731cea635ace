"""Throughput against world size (weak scaling), and hvdtrain against Horovod's own benchmark.

Every model at every world size N is one launch of hvdtrain's real Trainer (shared/trainer_job:
one core per rank at every N, the total rate counted over all ranks at the slowest rank's
time) per round (shared/training_rounds: one round alone, all of bench stacks' under bench
all), and each row is the job of median rate over the rounds. Weak-scaling efficiency is
T_N / (N * T_1) on those rows' medians.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.launch import launchers
from hvdtrain.bench import registry
from hvdtrain.bench.shared import (arguments, horovod_synthetic, host, plain_job, plans, plots,
                                   report, stats, steps, targets, training_rounds)
from hvdtrain.bench.shared.workloads import PLAIN_KERAS, WORKLOADS, model_names


def add_efficiency(rows: list[dict], plain: dict[str, float] | None = None) -> None:
    """Adds each row's weak-scaling efficiency against its model's 1-rank row (and whether it
    is above the ceiling that only noise reaches), and the 1-rank row's rate over the plain
    fit's (``plain``: samples/s per model; a single pair, bench tax has the interleaved rounds)."""
    plain = plain or {}
    base = {r["model"]: r["total_samples_per_sec"]["median"] for r in rows if r["ranks"] == 1}
    for r in rows:
        if r["ranks"] == 1 and r["model"] in plain:
            r["over_plain_fit"] = r["total_samples_per_sec"]["median"] / plain[r["model"]]
        if r["model"] in base:
            r["weak_scaling_efficiency"] = steps.weak_scaling_efficiency(
                r["total_samples_per_sec"]["median"], r["ranks"], base[r["model"]])
            r["efficiency_above_ceiling"] = (r["weak_scaling_efficiency"]
                                             > targets.EFFICIENCY_CEILING)


def efficiency_cell(row: dict) -> Any:
    """The efficiency of ``row`` for a table, marked as noise when above the ceiling."""
    e = row.get("weak_scaling_efficiency")
    if e is None:
        return None
    if row.get("efficiency_above_ceiling"):
        return f"{e:.4f} (above {targets.EFFICIENCY_CEILING}: noise)"
    if row["ranks"] == 1:
        return f"{e:.4f}"
    return f"{e:.4f}: {stats.verdict(e, targets.EFFICIENCY)}"


def request(models: Sequence[str], plan: plans.Plan, rounds: int) -> training_rounds.Request:
    """The hvdtrain jobs bench scaling times: every model at every world size of ``plan``."""
    return training_rounds.Request(models=tuple(models), pythons=(("this", sys.executable),),
                                   plan=plan, rounds=rounds, sides=plan.world_sizes)


def median_job(jobs: Sequence[dict]) -> dict:
    """Of one world size's jobs over rounds, the one of median total rate (the lower of the
    two middle ones for an even count): a row measured as one job, not a mix of several."""
    ranked = sorted(jobs, key=lambda job: job["total_samples_per_sec"]["median"])
    return ranked[(len(ranked) - 1) // 2]


def run(out_dir: Path, *, own: training_rounds.Request, plan: plans.Plan, versus: dict[str, Any],
        source: training_rounds.Request | None = None) -> dict[str, Any]:
    """Every model at every world size (``own``: ``request``'s rounds, read from ``source``'s
    when given: bench all's, which hold them), each row its median round; ``versus`` is the
    comparison with Horovod's own benchmark (horovod_synthetic.run), reported beside the
    rows."""
    machine = host.machine()   # before the work: its load is the machine's own
    measured = training_rounds.measured(source or own)
    rows: list[dict] = []
    plain_fit: dict[str, float] = {}
    for name in own.models:
        for ranks in own.sides:
            jobs = [r["this"][ranks] for r in measured[name]["rounds"]]
            row = {**copy.deepcopy(median_job(jobs)), "rounds": len(jobs)}
            rows.append(row)
            report.say(f"scaling: {name} on {ranks} rank(s): "
                       f"{row['total_samples_per_sec']['median']:,.1f} samples/s total, the "
                       f"median of {len(jobs)} round(s)")
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for name in own.models:
            # The plain baseline: Keras fit with no Horovod, one process on one core, the
            # same plan, the model as Keras builds it (PLAIN_KERAS: what a user's own script
            # trains); bench tax's plain side, whose interleaved rounds against hvdtrain with
            # the same layers on both sides are the wrapper's own cost. It is set beside the
            # 1-rank row: without one, there is nothing to set it beside.
            if 1 in own.sides:
                report.say(f"scaling: {name}, plain Keras fit (no Horovod, one core)...")
                plain_fit[name], _ = plain_job.measure_plain(WORKLOADS[name], own.plan,
                                                             Path(tmp), assignments=PLAIN_KERAS)
    add_efficiency(rows, plain_fit)
    result = {"benchmark": "scaling", "machine": machine, "plan": asdict(plan),
              "results": rows, "plain_fit_samples_per_sec": plain_fit,
              "versus_horovod_synthetic": versus}
    report.write_outputs(out_dir, "scaling", result, markdown(result))
    plot(out_dir, result)
    return result


def markdown(result: dict) -> str:
    plan = result["plan"]
    rounds = result["results"][0].get("rounds", 1) if result["results"] else 1
    lines = [f"Weak scaling, {plan['launcher']} launcher, one core per rank, "
             f"{plan['repeats']} timed repeats of {plan['steps_per_repeat']} steps after "
             f"{plan['warmup_epochs']} warmup epoch(s); median (min..max) of the repeats of "
             f"one job, at each world size the job of median rate over {rounds} interleaved "
             f"round(s).", ""]
    rows = []
    plain = result.get("plain_fit_samples_per_sec", {})
    for i, r in enumerate(result["results"]):
        t, p = r["total_samples_per_sec"], r["per_rank_samples_per_sec"]
        over = r.get("over_plain_fit")
        rows.append([r["model"], r["ranks"], r["batch_size_per_rank"],
                     f"{t['median']:,.1f} ({t['min']:,.1f}..{t['max']:,.1f})"
                     + (f"; {over:.4f}x plain fit" if over is not None else ""),
                     f"{p['median']:,.1f}", efficiency_cell(r),
                     f"{r['core_budget'][0]['intra_op_threads']} intra / "
                     f"{len(r['core_budget'][0]['cores'])} core"])
        last = i + 1 == len(result["results"]) or result["results"][i + 1]["model"] != r["model"]
        if last and r["model"] in plain:
            rows.append([r["model"], "plain fit", r["batch_size_per_rank"],
                         f"{plain[r['model']]:,.1f} (one run)", "", "",
                         "1 process / 1 core, no Horovod"])
    lines.append(report.markdown_table(
        ["model", "ranks", "batch/rank", "samples/s total", "samples/s per rank",
         "efficiency", "budget per rank"], rows))
    lines += ["", "The plain fit row: Keras `model.fit` of the same model, batch, threads and "
                  "data with no Horovod, one process on one core, the model as Keras builds it "
                  "(on Keras 3, its own BatchNormalization ops: `model.fused_batch_norm=false`), "
                  "measured once in this run: what a script of your own gets. The wrapper's "
                  "own cost, with the same layers on both sides, over interleaved rounds with "
                  "its spread, is bench tax's. Under bench all the rounds are bench stacks' "
                  "(and tax's): bench stacks has each round's 2-rank efficiency against the same "
                  "round's 1-rank rate, with their spread."]
    lines += ["", horovod_synthetic.markdown(result["versus_horovod_synthetic"])]
    return "\n".join(lines)


def plot(out_dir: Path, result: dict) -> None:
    series = {}
    for r in result["results"]:
        xs, ys = series.setdefault(r["model"], ([], []))
        xs.append(r["ranks"])
        ys.append(r.get("weak_scaling_efficiency", math.nan))
    sizes = sorted({r["ranks"] for r in result["results"]})
    plots.plot_lines(out_dir / "scaling.png", series, title="Weak-scaling efficiency",
                      xlabel="ranks (one core each)", ylabel="T_N / (N * T_1)",
                      reference=(sizes, [1.0] * len(sizes)), reference_label="ideal")


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench scaling

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench scaling's options (bench all's too)."""
    arguments.add_models(parser)
    parser.add_argument("--world-sizes", default="1,2", help="comma list (default 1,2)")
    parser.add_argument("--launcher", choices=launchers.MULTI_RANK, default="mpi",
                        help="a multi-rank launcher of hvdtrain/launch/launchers.py (default mpi: "
                             "mpirun --bind-to core; gloo: horovodrun)")
    parser.add_argument("--horovod-synthetic", metavar="PATH", type=Path,
                        help="Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark"
                             ".py: also compare with it (skipped when absent)")
    parser.add_argument("--horovod-venv", metavar="VENV", type=Path, default=None,
                        help="run Horovod's script with this virtualenv's Python (e.g. "
                             ".venv-keras2: it cannot run on Keras 3); hvdtrain runs on this "
                             "one's")
    arguments.add_rounds(parser, "interleaved rounds (default: each benchmark's own)")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench scaling``: the plan from the options, Horovod's own benchmark beside
    it when --horovod-synthetic names it, then every model at every world size."""
    base = plans.QUICK if args.quick else plans.FULL
    plan = plans.Plan(world_sizes=plans.world_sizes(args.world_sizes),
                warmup_epochs=base.warmup_epochs, repeats=base.repeats,
                steps_per_repeat=base.steps_per_repeat, launcher=args.launcher)
    horovod_python = arguments.venv_python(args.horovod_venv, "--horovod-venv") or sys.executable
    versus = horovod_synthetic.run(args.horovod_synthetic, quick=args.quick,
                                horovod_python=horovod_python, rounds=args.rounds)
    own = request(model_names(args.models, args.quick), plan, args.rounds or 1)
    run(Path(args.out), own=own, plan=plan, versus=versus,
        source=training_rounds.shared_in_all(args, own))


BENCHMARK = registry.Benchmark(
    name="scaling", help="throughput and weak-scaling efficiency against world size",
    main=main, add_arguments=add_arguments, in_all=True, title="Throughput against world size")
