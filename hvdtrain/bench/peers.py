"""hvdtrain against the reference notes' systems, on the same work.

The same model (hvdtrain's ``cnn``), data (scikit-learn's ``digits``: 1,437 train / 360 eval),
per-replica batch (32), optimizer (SGD, momentum 0.9) and seed, under:

- ``single``: hvdtrain in one process alone (lr 0.05);
- ``hvdtrain``: 2 ranks, Horovod ring all-reduce (``mpirun -np 2``, hvdtrain's defaults): global
  batch 64, lr 0.05 per rank scaled to 0.1 over a one-epoch warmup;
- ``hvdtrain-gloo``: the same job under ``horovodrun --gloo`` (ranks unbound), as
  ``run_scripts/local.sh`` launches it where mpirun is missing: Gloo against MPI on the demo job;
- ``mwms``: tf.distribute ``MultiWorkerMirroredStrategy``, 2 worker processes with TF_CONFIG on
  localhost ports (synchronous, all-reduce over gRPC): global batch 64, the same lr schedule;
- ``ps``: tf.distribute ``ParameterServerStrategy``, one coordinator, one parameter server and
  2 workers as local processes (asynchronous: every worker step applies its own batch of 32 at
  lr 0.05, the one-process lr, the same number of samples per epoch).

Every worker (or rank) has one intra-op thread and is bound to a core of its own, except under
``ps``: a ParameterServerStrategy worker bound to one core hangs in its first step (TF 2.15,
measured), so its processes (workers, parameter server, coordinator) are unbound, with one
intra-op thread each. Each epoch ends with an exact evaluation on all 360 eval samples.
Reported: samples/s (the median epoch after the first, which traces), and the time from the
start of training to the end of the first epoch with eval accuracy >= 95%.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.bench import registry
from hvdtrain.bench.shared import arguments, host, plots, report, stats, targets
from hvdtrain.bench.shared.peer_launch import (TARGET_ACCURACY, epoch_rates,  # noqa: F401
                                               launch_system, time_to_accuracy)
from hvdtrain.bench.shared.peer_systems import BATCH, LAUNCH, SYSTEMS, WORKERS

ROUNDS, QUICK_ROUNDS = 3, 1
GLOO_TARGET = targets.GLOO_OVER_MPI
# tf.distribute's multi-worker strategies train with Keras 2's fit only. On Keras 3 (TensorFlow
# 2.16 and later) fit under MultiWorkerMirroredStrategy stops converting its PerReplica inputs
# (measured with TF 2.18/Keras 3.15; keras-team/keras#20585, open), and Keras 3 has neither
# ParameterServerStrategy support nor the DatasetCreator that feeds it.
UNAVAILABLE_ON_KERAS3 = {
    "mwms": "Keras 3's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585)",
    "ps": "Keras 3's fit has no ParameterServerStrategy support (no DatasetCreator)"}
FULL_EPOCHS, QUICK_EPOCHS = 10, 3



def unavailable(system: str, python: str = sys.executable) -> str | None:
    """Why ``system`` cannot run on the stack of ``python``, or None. (Read from its package
    metadata: the driver loads no TensorFlow.)"""
    if host.stack_versions(python).get("keras", "").startswith("3."):
        return UNAVAILABLE_ON_KERAS3.get(system)
    return None


def plan_systems(python: str, other_python: str | None) -> dict[str, dict[str, Any]]:
    """Per system: the interpreter that runs it (another venv's where this stack cannot and
    that one can), or why it is not run."""
    plan: dict[str, dict[str, Any]] = {}
    for system in SYSTEMS:
        reason = unavailable(system, python)
        if reason is None:
            plan[system] = {"python": python}
        elif other_python and unavailable(system, other_python) is None:
            plan[system] = {"python": other_python, "other_stack_because": reason}
        else:
            plan[system] = {"unavailable": reason}
    return plan


def middle(values: Sequence[float | None]) -> float | None:
    """The median of the rounds that reached a figure (None: none did)."""
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def summarize_system(system: str, runs: list[dict[str, Any]], how: dict[str, Any]
                     ) -> dict[str, Any]:
    """One system over its rounds: medians and spreads of samples/s and of the seconds to 95%,
    how many rounds reached 95%."""
    rates = [r["samples_per_sec"] for r in runs if r["samples_per_sec"] is not None]
    reached = [r["seconds_to_95"] for r in runs if r["seconds_to_95"] is not None]
    return {"system": system, "workers": LAUNCH.get(system, ("", WORKERS))[1],
            "stack": host.stack_line(host.stack_versions(how["python"])),
            **({"other_stack_because": how["other_stack_because"]}
               if "other_stack_because" in how else {}),
            "samples_per_sec": stats.summarize(rates) if rates else None,
            "seconds_to_95": stats.summarize(reached) if reached else None,
            "rounds_reaching_95": len(reached),
            "final_eval_accuracy": middle([r["final_eval_accuracy"] for r in runs]),
            "wall_seconds_with_startup": middle([r["wall_seconds_with_startup"] for r in runs]),
            "rounds": runs}


def per_round_ratio(runs: dict[str, list[dict[str, Any]]], top: str, bottom: str,
                    key: str = "samples_per_sec") -> dict[str, Any] | None:
    """``top`` / ``bottom`` of ``key`` per round (both measured in it), summarized."""
    pairs = [(a[key], b[key]) for a, b in zip(runs.get(top, []), runs.get(bottom, []))
             if a[key] and b[key]]
    return stats.ratio_summary([a / b for a, b in pairs]) if pairs else None


def run(out_dir: Path, *, quick: bool = False, rounds: int | None = None,
        other_python: str | None = None) -> dict[str, Any]:
    machine = host.machine()   # before the work: its load is the machine's own
    epochs = QUICK_EPOCHS if quick else FULL_EPOCHS
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    plan = plan_systems(sys.executable, other_python)
    ran = [s for s in SYSTEMS if "unavailable" not in plan[s]]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in ran}
    loads = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for i in range(rounds):
            loads.append(host.load_average())
            for system in ran if i % 2 == 0 else ran[::-1]:
                where = " (other stack)" if "other_stack_because" in plan[system] else ""
                report.say(f"peers: round {i + 1}/{rounds}, {system}, {epochs} epochs of "
                           f"digits{where}...")
                r = launch_system(system, epochs, Path(tmp), plan[system]["python"])
                runs[system].append(r)
                report.say(f"  {r['samples_per_sec'] or float('nan'):,.0f} samples/s, eval "
                           f"accuracy {r['final_eval_accuracy']:.3f}, to 95%: "
                           f"{r['seconds_to_95']}")
    rows = []
    for system in SYSTEMS:
        if system not in runs:
            report.say(f"peers: {system}: not run, {plan[system]['unavailable']}")
            rows.append({"system": system, "workers": WORKERS,
                         "unavailable": plan[system]["unavailable"]})
            continue
        row = summarize_system(system, runs[system], plan[system])
        row["hvdtrain_speedup"] = per_round_ratio(runs, "hvdtrain", system)
        rows.append(row)
    result = {"benchmark": "peers", "machine": machine, "epochs": epochs, "rounds": rounds,
              "batch_per_replica": BATCH, "target_accuracy": TARGET_ACCURACY,
              "load_average_before_each_round": loads, "results": rows,
              "gloo_over_mpi": per_round_ratio(runs, "hvdtrain-gloo", "hvdtrain"),
              "gloo_target": GLOO_TARGET}
    report.write_outputs(out_dir, "peers", result, markdown(result))
    plot(out_dir, result)
    return result


def _seconds_cell(r: dict[str, Any], rounds: int) -> str:
    t = r["seconds_to_95"]
    if t is None:
        return "not reached"
    reached = "" if r["rounds_reaching_95"] == rounds else \
        f"; reached in {r['rounds_reaching_95']} of {rounds} rounds"
    return f"{t['median']:.1f} (spread {t['spread']:.1%}{reached})"


def time_verdicts(result: dict[str, Any]) -> list[str]:
    """Item 5's targets: hvdtrain's seconds to 95% <= one process alone's and <= MWMS's, as the
    median over rounds of the per-round ratio hvdtrain / other (both measured in each round),
    with its spread: past the spread limit the verdict is noise."""
    by = {r["system"]: r for r in result["results"]}
    lines = []
    for other in ("single", "mwms"):
        if "unavailable" in by.get(other, {"unavailable": "absent"}):
            lines.append(f"hvdtrain against {other}: {other} not run")
            continue
        pairs = [(a["seconds_to_95"], b["seconds_to_95"]) for a, b in
                 zip(by.get("hvdtrain", {}).get("rounds", []), by[other].get("rounds", []))]
        reached = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not reached:
            lines.append(f"hvdtrain against {other}: no round where both reached 95%")
            continue
        ratio = stats.ratio_summary([a / b for a, b in reached])
        lines.append(f"seconds to 95%, hvdtrain / {other}, per round ({len(reached)} of "
                     f"{len(pairs)} rounds): {stats.ratio_cell(ratio, 1, at_least=False)}")
    return lines


def markdown(result: dict[str, Any]) -> str:
    rows = []
    rounds = result["rounds"]
    for r in result["results"]:
        if "unavailable" in r:
            rows.append([r["system"], r["workers"], "", f"not run: {r['unavailable']}", "", "",
                         "", ""])
            continue
        s = r["samples_per_sec"]
        stack = r["stack"] + (" (other venv: this stack cannot)" if "other_stack_because" in r
                              else "")
        speedup = r.get("hvdtrain_speedup")
        rows.append([r["system"], r["workers"], stack,
                     f"{s['median']:,.0f} (spread {s['spread']:.1%})" if s else "",
                     stats.ratio_cell(speedup) if speedup and r["system"] != "hvdtrain" else "",
                     _seconds_cell(r, rounds), f"{r['final_eval_accuracy']:.3f}",
                     f"{r['wall_seconds_with_startup']:.0f}"])
    gloo = result.get("gloo_over_mpi")
    lines = [
        f"digits, cnn, batch {result['batch_per_replica']} per replica, {result['epochs']} "
        f"epochs, one core per worker, {rounds} interleaved rounds (load before each: "
        f"{', '.join(f'{x:.2f}' for x in result['load_average_before_each_round'])}); "
        f"samples/s: median epoch after the first, then the median over rounds (spread = "
        f"(max - min) / median); hvdtrain / this: per-round ratio of samples/s:", "",
        report.markdown_table(["system", "workers", "stack", "samples/s", "hvdtrain / this",
                               "s to 95% eval acc", "final eval acc",
                               "wall s (with start-up)"], rows), ""]
    lines += [f"- {line}" for line in time_verdicts(result)]
    if gloo:
        lines.append(f"- the demo job under Gloo (`horovodrun --gloo`, as `local.sh` launches "
                     f"it where mpirun is missing) over MPI (`mpirun`), samples/s per round: "
                     f"{stats.ratio_cell(gloo, result['gloo_target'])}")
    return "\n".join(lines)


def plot(out_dir: Path, result: dict[str, Any]) -> None:
    """Eval accuracy against time, each system's first round."""
    series = {r["system"]: (r["rounds"][0]["raw"]["epoch_ends"],
                            r["rounds"][0]["raw"]["accuracies"])
              for r in result["results"] if "unavailable" not in r}
    plots.plot_lines(out_dir / "peers.png", series,
                      title="Eval accuracy against time (digits, first round)",
                      xlabel="seconds since training began", ylabel="eval accuracy",
                      reference=([0, max(max(xs) for xs, _ in series.values())],
                                 [TARGET_ACCURACY] * 2), reference_label="95%")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench peers' options (bench all's too)."""
    arguments.add_other_venv(parser)
    arguments.add_rounds(parser, f"interleaved rounds (default {ROUNDS}; --quick: "
                                 f"{QUICK_ROUNDS})")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench peers``: what this stack cannot run (MWMS and PS on Keras 3) runs in
    --other-venv's, marked so in the table."""
    run(Path(args.out), quick=args.quick, rounds=args.rounds,
        other_python=arguments.venv_python(args.other_venv, "--other-venv"))


BENCHMARK = registry.Benchmark(
    name="peers", help="hvdtrain against MultiWorkerMirroredStrategy, ParameterServerStrategy "
                       "and one process, on digits",
    main=main, add_arguments=add_arguments, in_all=True,
    title="hvdtrain against tf.distribute's strategies")

