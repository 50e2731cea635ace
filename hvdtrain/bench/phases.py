"""Where the gradients' all-reduce spends a 2-rank training step: bench scaling's 2-rank job
with a Horovod timeline, on this stack and on another's virtualenv (``--other-venv``) in
interleaved rounds.

The phases, and how a step's are read from rank 0's timeline: shared/timeline.py. This stack
runs once more through Horovod's grouped all-reduce (horovod.flatten off) and once more with its
reduction in buckets (``--bucket-mb``, horovod.bucket_mb): the share of the all-reduce that ran
during backprop, and each step against this stack's own (one flat tensor after backprop) of
the same round (Keras 2's Horovod optimizer reduces gradient by gradient: its share is
Horovod's).
With ``--other-horovod DIR`` this stack runs once more with the Horovod package in DIR first on
its ranks' PYTHONPATH (another build of Horovod, one without hvdtrain's patches say), in the same
rounds.
Each round times raw ``MPI_Allreduce`` of the gradients' bytes (as the timeline gives them) in a
launch of its own right after this stack's job, and each all-reduce that ran after backprop is
held against it (target: shared/targets.py).
Medians over the timed steps (the warmup epochs left out), then over rounds. The timeline's own
writing slows the job a little: these are a breakdown, the rates are bench scaling's.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from hvdtrain.errors import UserError
from hvdtrain.bench import registry
from hvdtrain.bench.shared import (against_raw, arguments, host, interleave, jobs, plans, plots,
                                   report, stats, steps, trainer_job)
from hvdtrain.bench.shared.timeline import (PHASES, read_timeline, step_phases, tensor_bytes,
                                            tensor_phases)
from hvdtrain.bench.shared.workloads import WORKLOADS, Workload

SPREAD_LIMIT = stats.SPREAD_LIMIT
RANKS = 2
BUCKET_MB = 2.0   # MobileNetV2's 9.1 MB of gradients in about 5 buckets
# --quick's MLP holds well under a megabyte of gradients: buckets of 100 bytes split it (each
# gradient but the smallest biases alone), so that a smoke test goes through the bucket path.
QUICK_BUCKET_MB = 0.0001
# bench all measures the model whose all-reduce is a part of the step worth breaking down
# (the small ResNet's gradients fit in one small bucket) and keeps make bench in its budget.
IN_ALL_MODELS = "mobilenetv2"


GROUPED = "this, grouped"   # horovod.flatten off
OTHER_HOROVOD = "this, other Horovod build"   # --other-horovod


def bucket_variant(bucket_mb: float) -> str:
    """The name this stack's bucketed run goes by in the results."""
    return f"this, {bucket_mb:g} MB buckets"


# ---------------------------------------------------------------------------------------------
# The driver

def measure(workload: Workload, plan: plans.Plan, work_dir: Path, python: str,
            settings: Sequence[str] = (), env: Mapping[str, str] | None = None,
            raw_mpi: bool = False) -> dict[str, Any]:
    """bench scaling's 2-rank job with a timeline, on the stack of ``python`` with the config
    ``settings`` added and ``env`` in its environment: its samples/s, stack, the gradients'
    phases per step and their bytes; with ``raw_mpi``, then raw MPI_Allreduce's milliseconds
    for those bytes."""
    job = plans.job_options(workload, RANKS, plan, work_dir)
    job["assignments"] += list(settings)
    timeline = Path(job["out"]).with_suffix(".timeline.json")
    what = f"bench phases: {workload.name} on {RANKS} ranks"
    # Horovod: the coordinator writes the timeline that this variable names, read at init.
    raw = trainer_job.run(job, RANKS, python, what=what,
                          env={**(env or {}), "HOROVOD_TIMELINE": str(timeline)})
    if not timeline.exists():
        raise jobs.BenchError(f"{what} wrote no timeline to {timeline}")
    steps_per_epoch = plan.steps_per_repeat + 1
    events = read_timeline(timeline.read_text())
    found = step_phases(tensor_phases(events), skip=plan.warmup_epochs * steps_per_epoch,
                        sizes=tensor_bytes(events))
    if raw_mpi and "gradient_bytes" in found:
        found["raw_mpi_ms"] = against_raw.raw_mpi_ms(found["gradient_bytes"], RANKS, work_dir)
    rates = steps.repeat_rates(raw["ranks"])
    return {"stack": raw["stack"], "controller": raw["controller"],
            "params": raw["ranks"][0]["params"],
            "inter_op_threads": raw["ranks"][0]["inter_op_threads"],
            "samples_per_sec": stats.summarize(rates)["median"], **found}


def summarize_model(name: str, rounds: Sequence[Mapping[str, dict]],
                    loads: Sequence[float]) -> dict[str, Any]:
    """One model's rounds: per stack the medians over rounds of the step and of each phase,
    and each phase's share of the step per round (median and spread)."""
    medians, shares = {}, {}
    for which in rounds[0]:
        jobs = [r[which] for r in rounds]
        names = [n for n in PHASES if all(n in j["phases_ms"] for j in jobs)]
        medians[which] = {"step_ms": statistics.median(j["step_ms"] for j in jobs),
                          "phases_ms": {n: statistics.median(j["phases_ms"][n] for j in jobs)
                                        for n in names}}
        shares[which] = {n: stats.ratio_summary([j["phases_ms"][n] / j["step_ms"]
                                                  for j in jobs], SPREAD_LIMIT) for n in names}
    overlap = {which: {"during_backprop": stats.ratio_summary(
                           [r[which]["during_backprop"] for r in rounds], SPREAD_LIMIT),
                       "step_vs_this": stats.ratio_summary(
                           [r[which]["step_ms"] / r["this"]["step_ms"] for r in rounds],
                           SPREAD_LIMIT)}
               for which in rounds[0] if "during_backprop" in rounds[0][which]}
    return {"model": name, "rounds": list(rounds), "load_average_before_each_round": list(loads),
            "medians": medians, "share_of_step": shares, "overlap": overlap,
            "of_raw_mpi": against_raw.of_raw_mpi(rounds)}


def run(out_dir: Path, *, models: Sequence[str], rounds: int = 3, quick: bool = False,
        python: str = sys.executable, other_python: str | None = None,
        bucket_mb: float = BUCKET_MB, other_horovod: Path | None = None) -> dict[str, Any]:
    """``rounds`` interleaved rounds per model on the stack of ``python``, in one bucket and
    in buckets of ``bucket_mb`` (0: not), with the Horovod in ``other_horovod`` (None: not),
    and on the stack of ``other_python``, written to phases.json/.md/.png."""
    machine = host.machine(python)   # before the work: its load is the machine's own
    plan = dataclasses.replace(plans.QUICK if quick else plans.FULL, world_sizes=(RANKS,))
    # Each run by its name in the results: its interpreter, the config settings it adds and
    # the environment its ranks get.
    Run = tuple[str, tuple[str, ...], dict[str, str]]
    runs: dict[str, Run] = {
        which: (stack, (), {}) for which, stack in interleave.stack_pythons(
            python, other_python).items()}
    # This stack once more through Horovod's grouped all-reduce (the gradients copied through
    # its fusion buffer), against which its flat tensor is measured, in buckets, and with
    # another Horovod build.
    variants: dict[str, Run] = {GROUPED: (python, ("horovod.flatten=false",), {})}
    if bucket_mb > 0:
        variants[bucket_variant(bucket_mb)] = (python, (f"horovod.bucket_mb={bucket_mb:g}",),
                                               {})
    if other_horovod is not None:
        variants[OTHER_HOROVOD] = (python, (), {"PYTHONPATH": str(other_horovod.resolve())})
    runs = {"this": runs["this"], **variants, **{k: v for k, v in runs.items() if k != "this"}}
    # The rounds hand measure() each run's name (its value here), which picks the run.
    results = interleave.rounds_per_model(
        "phases", models, rounds, {which: which for which in runs},
        lambda name, work_dir, which: measure(WORKLOADS[name], plan, work_dir, *runs[which],
                                              raw_mpi=which == "this"),
        summarize_model)
    result = {"benchmark": "phases", "machine": machine, "ranks": RANKS,
              "other_horovod": str(other_horovod) if other_horovod else None,
              "stacks": {k: results[0]["rounds"][0][k]["stack"] for k in runs}
              if results else {},
              "plan": {"rounds": rounds, **dataclasses.asdict(plan)}, "results": results}
    report.write_outputs(out_dir, "phases", result, markdown(result))
    plots.plot_bars(out_dir / "phases.png",
                     {f"{r['model']}, {which}": {PHASES[n]: ms for n, ms in
                                                 r["medians"][which]["phases_ms"].items()
                                                 if n != "ALLREDUCE"}
                      for r in results for which in runs},
                     title="The gradients' all-reduce in a 2-rank step",
                     ylabel="ms per step (median over rounds)")
    return result


def share_text(share: Mapping[str, Any]) -> str:
    """'6.3% (spread 4.0%)', and 'noise' past the spread limit."""
    return (f"{share['median']:.1%} (spread {share['spread']:.1%})"
            + (" noise" if share["noise"] else ""))


def tensors(count: int) -> str:
    """The tensors a step all-reduced: the binding's flat one (or one per bucket), or each
    gradient apart (Horovod's own optimizer)."""
    return f"{count} tensor{'' if count == 1 else 's'} all-reduced"


def markdown(result: dict[str, Any]) -> str:
    stacks = result["stacks"]
    lines = [
        f"bench scaling's {result['ranks']}-rank job (one core per rank) with a Horovod "
        f"timeline, {result['plan']['rounds']} interleaved rounds; "
        + "; ".join(f"{k} = {line}" for k, line in stacks.items())
        + (f"; {OTHER_HOROVOD}: its ranks import Horovod from {result['other_horovod']} "
           f"(first on their PYTHONPATH)" if result.get("other_horovod") else "") + ". "
        f"{host.machine_line(result['machine'])}. Per step, from rank 0's timeline: the "
        f"step (from one step's all-reduce to the next), and the wall time each phase of the "
        f"gradients' all-reduce covers (medians over the timed steps, then over rounds); its "
        f"share of the step per round, median (spread). Where the gradients go in one "
        f"all-reduce after backprop (hvdtrain's binding: one flat tensor, or one per bucket; "
        f"one tensor is not copied through Horovod's fusion buffer), the phases are its cost; "
        f"where they "
        f"go one by one as backprop produces them (Horovod's own optimizer, on Keras 2), their "
        f"all-reduces overlap backprop and each other, and a phase's time is how long one of "
        f"them is in it, not what it costs. The timeline's writing slows the job a little: "
        f"the rates are bench scaling's.", ""]
    rows = []
    for r in result["results"]:
        for which in stacks:
            m, share = r["medians"][which], r["share_of_step"][which]
            rows.append([r["model"], which,
                         f"step ({tensors(r['rounds'][0][which]['gradients'])})",
                         f"{m['step_ms']:.2f}", ""])
            rows += [[r["model"], which, PHASES[n], f"{ms:.2f}", share_text(share[n])]
                     for n, ms in m["phases_ms"].items()]
    lines.append(report.markdown_table(["model", "stack", "figure", "ms per step",
                                        "share of the step"], rows))
    overlap = [[r["model"], which, share_text(o["during_backprop"]),
                stats.ratio_text(o["step_vs_this"]) + (" noise" if o["step_vs_this"]["noise"]
                                                       else "")]
               for r in result["results"] for which, o in r["overlap"].items()]
    lines += ["", "The all-reduce during backprop: the share of its wall time that ran before "
                  "the step's last gradient was asked for (when no rank had finished backprop "
                  "yet), median over rounds (spread); and the step against this stack's "
                  "own (one flat tensor after backprop) of the same round, median ratio "
                  "(spread).", "",
              report.markdown_table(["model", "stack", "all-reduce during backprop",
                                     "step / this stack's step"], overlap)]
    return "\n".join(lines + against_raw.table_lines(result))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.add_stack_arguments(parser)
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help=f"this stack once more with horovod.bucket_mb=MB (default "
                             f"{BUCKET_MB:g}; --quick: {QUICK_BUCKET_MB:g}; 0: not)")
    parser.add_argument("--other-horovod", type=Path, default=None, metavar="DIR",
                        help="this stack once more with the horovod package in DIR (another "
                             "build, say one without hvdtrain's patches) first on its ranks' "
                             "PYTHONPATH")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench phases``; in bench all, without --models, on IN_ALL_MODELS alone."""
    if getattr(args, "in_all", False) and not args.models and not args.quick:
        args = argparse.Namespace(**{**vars(args), "models": IN_ALL_MODELS})
    bucket_mb = args.bucket_mb if args.bucket_mb is not None else (
        QUICK_BUCKET_MB if args.quick else BUCKET_MB)
    other_horovod = getattr(args, "other_horovod", None)
    if other_horovod is not None and not (other_horovod / "horovod" / "__init__.py").exists():
        raise UserError(f"--other-horovod {other_horovod}: no horovod package in it")
    run(Path(args.out), **arguments.stack_choice(args), bucket_mb=bucket_mb,
        other_horovod=other_horovod)


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench phases

BENCHMARK = registry.Benchmark(
    name="phases", help="where the gradients' all-reduce spends a 2-rank step (Horovod's "
                        "timeline: the wait, the copies, the collective), this stack against "
                        "--other-venv's",
    main=main, add_arguments=add_arguments, in_all=True,
    title="The gradients' all-reduce in a 2-rank step")
