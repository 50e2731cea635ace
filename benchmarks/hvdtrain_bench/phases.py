"""Where the gradients' all-reduce spends a 2-rank training step: bench scaling's 2-rank job
with a Horovod timeline, on this stack and on another's virtualenv (``--other-venv``) in
interleaved rounds.

Horovod's coordinator (rank 0) records each tensor's phases: the negotiation (from the first
rank's request until every rank has asked: the wait for the slower rank), then the all-reduce
itself, which on a CPU copies the tensors into the fusion buffer, runs ``MPI_Allreduce`` (or
Gloo's) on it, and copies them out. Every gradient is reduced once a step, so the k-th
occurrence of each gradient's phases belongs to step k; a phase's time in a step is the wall
time the union of its intervals over the gradients covers (fused tensors share one interval,
so they count once). The step is the time between the all-reduce's starts of successive steps.
Medians over the timed steps (the warmup epochs left out), then over rounds. The timeline's own
writing slows the job a little: these are a breakdown, the rates are bench scaling's.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hvdtrain_bench import registry
from hvdtrain_bench.shared import (arguments, host, interleave, jobs, plans, plots, report, stats,
                                   steps, trainer_job)
from hvdtrain_bench.shared.workloads import WORKLOADS, Workload

SPREAD_LIMIT = stats.SPREAD_LIMIT
RANKS = 2
# Horovod's phase names for an all-reduce on a CPU, in the order a step goes through them.
PHASES = {"NEGOTIATE_ALLREDUCE": "negotiation (wait for the slower rank)",
          "MEMCPY_IN_FUSION_BUFFER": "copy into the fusion buffer",
          "MPI_ALLREDUCE": "MPI_Allreduce", "GLOO_ALLREDUCE": "Gloo all-reduce",
          "MEMCPY_OUT_FUSION_BUFFER": "copy out of the fusion buffer",
          "ALLREDUCE": "all-reduce (copies, collective and the rest)"}
Interval = tuple[float, float]


# ---------------------------------------------------------------------------------------------
# What a timeline holds

def read_timeline(text: str) -> list[dict[str, Any]]:
    """A Horovod timeline's events; Horovod leaves the JSON array open while it runs."""
    body = text.rstrip().rstrip(",")
    return json.loads(body if body.endswith("]") else body + "]")


def tensor_phases(events: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, list[Interval]]]:
    """Per tensor (a timeline 'process'), per phase name, its intervals in microseconds, in
    order; a phase is a B event and the E event that closes it."""
    open_phases: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    phases: dict[int, dict[str, list[Interval]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e.get("ph") == "B":
            open_phases[e["pid"]].append(e)
        elif e.get("ph") == "E" and open_phases[e["pid"]]:
            begin = open_phases[e["pid"]].pop()
            phases[e["pid"]][begin["name"]].append((float(begin["ts"]), float(e["ts"])))
    return phases


def covered(intervals: Iterable[Interval]) -> float:
    """The length of the union of ``intervals``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def step_phases(phases: Mapping[int, Mapping[str, list[Interval]]], skip: int
                ) -> dict[str, Any]:
    """The gradients' phases per step, in milliseconds: medians over the steps after the first
    ``skip``. The gradients are the tensors all-reduced the most times, once a step each."""
    counts = {pid: len(p.get("ALLREDUCE", [])) for pid, p in phases.items()}
    steps = max(counts.values(), default=0)
    gradients = [pid for pid, n in counts.items() if n == steps]
    if steps - skip < 3:
        raise jobs.BenchError(f"bench phases: the timeline holds {steps} all-reduces of the "
                                f"gradients, {skip} of them warmup: too few to time")
    per_phase: dict[str, list[float]] = {}
    for name in PHASES:
        if all(len(phases[pid].get(name, [])) == steps for pid in gradients):
            per_phase[name] = [covered(phases[pid][name][k] for pid in gradients) / 1e3
                               for k in range(skip, steps)]
    starts = [min(phases[pid]["ALLREDUCE"][k][0] for pid in gradients)
              for k in range(skip, steps)]
    return {"gradients": len(gradients), "steps": steps - skip,
            "step_ms": statistics.median(b - a for a, b in zip(starts, starts[1:])) / 1e3,
            "phases_ms": {name: statistics.median(v) for name, v in per_phase.items()}}


# ---------------------------------------------------------------------------------------------
# The driver

def measure(workload: Workload, plan: plans.Plan, work_dir: Path,
            python: str) -> dict[str, Any]:
    """bench scaling's 2-rank job with a timeline, on the stack of ``python``: its
    samples/s, stack and the gradients' phases per step."""
    job = plans.job_options(workload, RANKS, plan, work_dir)
    timeline = Path(job["out"]).with_suffix(".timeline.json")
    what = f"bench phases: {workload.name} on {RANKS} ranks"
    # Horovod: the coordinator writes the timeline that this variable names, read at init.
    raw = trainer_job.run(job, RANKS, python, what=what,
                          env={"HOROVOD_TIMELINE": str(timeline)})
    if not timeline.exists():
        raise jobs.BenchError(f"{what} wrote no timeline to {timeline}")
    steps_per_epoch = plan.steps_per_repeat + 1
    found = step_phases(tensor_phases(read_timeline(timeline.read_text())),
                        skip=plan.warmup_epochs * steps_per_epoch)
    rates = steps.repeat_rates(raw["ranks"])
    return {"stack": raw["stack"], "controller": raw["controller"],
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
    return {"model": name, "rounds": list(rounds), "load_average_before_each_round": list(loads),
            "medians": medians, "share_of_step": shares}


def run(out_dir: Path, *, models: Sequence[str], rounds: int = 3, quick: bool = False,
        python: str = sys.executable, other_python: str | None = None) -> dict[str, Any]:
    """``rounds`` interleaved rounds per model on the stack of ``python`` (and of
    ``other_python``), written to phases.json/.md/.png."""
    machine = host.machine(python)   # before the work: its load is the machine's own
    plan = dataclasses.replace(plans.QUICK if quick else plans.FULL, world_sizes=(RANKS,))
    pythons = interleave.stack_pythons(python, other_python)
    results = interleave.rounds_per_model(
        "phases", models, rounds, pythons,
        lambda name, work_dir, python: measure(WORKLOADS[name], plan, work_dir, python),
        summarize_model)
    result = {"benchmark": "phases", "machine": machine, "ranks": RANKS,
              "stacks": {k: results[0]["rounds"][0][k]["stack"] for k in pythons}
              if results else {},
              "plan": {"rounds": rounds, **dataclasses.asdict(plan)}, "results": results}
    report.write_outputs(out_dir, "phases", result, markdown(result))
    plots.plot_bars(out_dir / "phases.png",
                     {f"{r['model']}, {which}": {PHASES[n]: ms for n, ms in
                                                 r["medians"][which]["phases_ms"].items()
                                                 if n != "ALLREDUCE"}
                      for r in results for which in pythons},
                     title="The gradients' all-reduce in a 2-rank step",
                     ylabel="ms per step (median over rounds)")
    return result


def share_text(share: Mapping[str, Any]) -> str:
    """'6.3% (spread 4.0%)', and 'noise' past the spread limit."""
    return (f"{share['median']:.1%} (spread {share['spread']:.1%})"
            + (" noise" if share["noise"] else ""))


def markdown(result: dict[str, Any]) -> str:
    stacks = result["stacks"]
    lines = [
        f"bench scaling's {result['ranks']}-rank job (one core per rank) with a Horovod "
        f"timeline, {result['plan']['rounds']} interleaved rounds; "
        + "; ".join(f"{k} = {line}" for k, line in stacks.items()) + ". "
        f"{host.machine_line(result['machine'])}. Per step, from rank 0's timeline: the "
        f"step (from one step's all-reduce to the next), and the wall time each phase of the "
        f"gradients' all-reduce covers (medians over the timed steps, then over rounds); its "
        f"share of the step per round, median (spread). Where the gradients go in one fused "
        f"all-reduce after backprop (hvdtrain's binding), the phases are its cost; where they "
        f"go one by one as backprop produces them (Horovod's own optimizer, on Keras 2), their "
        f"all-reduces overlap backprop and each other, and a phase's time is how long one of "
        f"them is in it, not what it costs. The timeline's writing slows the job a little: "
        f"the rates are bench scaling's.", ""]
    rows = []
    for r in result["results"]:
        for which in stacks:
            m, share = r["medians"][which], r["share_of_step"][which]
            rows.append([r["model"], which,
                         f"step ({r['rounds'][0][which]['gradients']} gradients)",
                         f"{m['step_ms']:.2f}", ""])
            rows += [[r["model"], which, PHASES[n], f"{ms:.2f}", share_text(share[n])]
                     for n, ms in m["phases_ms"].items()]
    lines.append(report.markdown_table(["model", "stack", "figure", "ms per step",
                                        "share of the step"], rows))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench phases

BENCHMARK = registry.Benchmark(
    name="phases", help="where the gradients' all-reduce spends a 2-rank step (Horovod's "
                        "timeline: the wait, the copies, the collective), this stack against "
                        "--other-venv's",
    main=arguments.stack_main(run), add_arguments=arguments.add_stack_arguments)
