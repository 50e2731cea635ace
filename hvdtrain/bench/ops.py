"""Where a training step's time goes, op by op: plain Keras ``fit`` of a benchmark model on one
core under TensorFlow's profiler, on this stack and on another's virtualenv (``--other-venv``)
in interleaved rounds.

Each job is bench tax's plain side (hvdtrain's model code, so the same layers on both stacks;
no Horovod): it trains its warmup and timed epochs, then one more epoch with the profiler on
from its second step to its last. Each op's time is its own, the time its profiler event spans
less the events nested in it on the same thread, summed per op type (``Conv2D``,
``_MklNativeConv2DBackpropFilter``, ...) over the profiled steps and divided by their number.
The op types of TensorFlow's oneDNN kernels start with ``_Mkl``: convolutions, batch norm,
matrix products; those are the library TensorFlow bundles, not Keras or hvdtrain. What a
profiled step takes beyond its ops is the runtime's (the executor, the fit loop, the memory
allocator). A ratio of two stacks is per round, then the median over rounds with its spread.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hvdtrain.bench import registry
from hvdtrain.bench.shared import (arguments, host, interleave, jobs, launch, plain_job, plans,
                                   plots, report, stats, steps)
from hvdtrain.bench.shared.workloads import WORKLOADS, Workload

SPREAD_LIMIT = stats.SPREAD_LIMIT
ONEDNN_PREFIX = "_Mkl"   # TensorFlow's op types of its oneDNN kernels on a CPU
TOP_OPS = 12             # op types per model in the second table
MODULE = "hvdtrain.bench.ops"
# A profiler event of one op: "scope/name:OpType", then TensorFlow's "#key=value,...#" stats.
_OP_EVENT = re.compile(r"^[^:#]+:([A-Za-z_][A-Za-z0-9_]*)(#.*)?$")


# ---------------------------------------------------------------------------------------------
# What a profile holds

def op_type(event_name: str) -> str | None:
    """The op type of a profiler event of one op ('scope/name:OpType'); None for the runtime's
    own events ('ExecutorState::Process', 'MemoryAllocation', ...)."""
    if "::" in event_name:
        return None
    match = _OP_EVENT.match(event_name)
    return match.group(1) if match else None


def self_times(events: Iterable[tuple[float, float, str]]) -> dict[str, float]:
    """Per name, the time its events spent outside the events nested in them; ``events``: one
    thread's (start, duration, name), in any order, nested or in sequence as a tracer records
    them."""
    ordered = sorted(events, key=lambda e: (e[0], -e[1]))
    own = [duration for _, duration, _ in ordered]
    open_events: list[int] = []   # indices of the events that enclose the current one
    for i, (start, duration, _) in enumerate(ordered):
        while open_events and sum(ordered[open_events[-1]][:2]) <= start:
            open_events.pop()
        if open_events:
            own[open_events[-1]] -= duration
        open_events.append(i)
    times: dict[str, float] = defaultdict(float)
    for (_, _, name), seconds in zip(ordered, own):
        times[name] += seconds
    return times


def op_seconds(lines: Iterable[Iterable[tuple[float, float, str]]]) -> dict[str, float]:
    """Per op type, its own time summed over every thread's events (``lines``, as
    ``self_times`` takes them); the runtime's events are left out."""
    totals: dict[str, float] = defaultdict(float)
    for events in lines:
        for name, own in self_times(events).items():
            kind = op_type(name)
            if kind:
                totals[kind] += own
    return totals


def profile_lines(log_dir: Path) -> list[list[tuple[float, float, str]]]:
    """The host threads' events of the one profile under ``log_dir``, in seconds. TensorFlow
    imports here."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError as e:   # where a TensorFlow release moved it
        raise jobs.BenchError(f"TensorFlow's profiler format is not where bench ops reads "
                                f"it: {e}") from e
    (path,) = glob.glob(str(log_dir / "**" / "*.xplane.pb"), recursive=True)
    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    lines = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            lines.append([(e.offset_ps * 1e-12, e.duration_ps * 1e-12, names[e.metadata_id])
                          for e in line.events])
    return lines


def groups(ops_ms: Mapping[str, float], step_ms: float) -> dict[str, float]:
    """A profiled step's milliseconds in the tables' groups."""
    onednn = sum(ms for kind, ms in ops_ms.items() if kind.startswith(ONEDNN_PREFIX))
    total = sum(ops_ms.values())
    return {"profiled step": step_ms, "all ops": total, "oneDNN kernels (_Mkl*)": onednn,
            "other ops": total - onednn, "beyond the ops (runtime)": step_ms - total}


# ---------------------------------------------------------------------------------------------
# The job: plain fit, one epoch profiled

def rank_main(options: dict[str, Any]) -> None:
    """Plain ``fit`` of one job's work (bench tax's plain side), then one more epoch profiled
    from its second step to its last; the median step of the timed epochs and each op type's
    milliseconds per profiled step written to ``options['out']``."""
    import tensorflow as tf

    job = plain_job.plain_job(options)
    timer = steps.step_timer()
    log_dir = Path(options["out"]).with_suffix(".profile")
    profiled_epoch = job.epochs   # the one after the job's own

    class Profile(tf.keras.callbacks.Callback):
        """The profiler on over the last epoch's steps after its first."""
        epoch, steps, started, seconds = -1, 0, 0.0, 0.0

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.epoch = epoch

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            if self.epoch == profiled_epoch and batch == 1:
                tf.profiler.experimental.start(str(log_dir))
                self.started = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            if self.epoch == profiled_epoch and batch >= 1:
                self.steps += 1

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            if epoch == profiled_epoch and self.started:
                self.seconds = time.perf_counter() - self.started
                tf.profiler.experimental.stop()

    profile = Profile()
    job.fit([timer, profile], epochs=job.epochs + 1)
    if not profile.steps:
        raise jobs.BenchError("bench ops: the profiled epoch had one step or none")
    ops = op_seconds(profile_lines(log_dir))
    unprofiled = steps.step_breakdown(timer.starts[:-1], timer.epochs[:-1],
                                        options["warmup_epochs"])
    figures = {"params": int(job.model.count_params()), "cores": [job.core],
               "intra_op_threads": job.intra_op_threads,
               "step_ms": 1e3 * unprofiled["step_seconds_median"],
               "profiled_steps": profile.steps,
               "profiled_step_ms": 1e3 * profile.seconds / profile.steps,
               "ops_ms": {kind: 1e3 * s / profile.steps
                          for kind, s in sorted(ops.items(), key=lambda item: -item[1])}}
    Path(options["out"]).write_text(json.dumps(figures))


# ---------------------------------------------------------------------------------------------
# The driver

def measure(workload: Workload, plan: plans.Plan, work_dir: Path,
            python: str) -> dict[str, Any]:
    """One profiled job on the stack of ``python``: its figures (see ``rank_main``)."""
    job = plans.job_options(workload, 1, plan, work_dir)
    what = f"bench ops: {workload.name}"
    printed = jobs.run_job(launch.rank_argv(MODULE, job, python), what=what)
    return jobs.read_json_output(Path(job["out"]), what, printed)


def summarize_model(name: str, rounds: Sequence[Mapping[str, dict]],
                    loads: Sequence[float]) -> dict[str, Any]:
    """One model's rounds (per round, each stack's figures): per stack the medians over rounds
    of each group and op type; with two stacks, this / other per round for each group."""
    stacks = list(rounds[0])
    grouped = {which: [groups(r[which]["ops_ms"], r[which]["profiled_step_ms"]) for r in rounds]
               for which in stacks}
    medians = {}
    for which in stacks:
        kinds = {kind for r in rounds for kind in r[which]["ops_ms"]}
        medians[which] = {
            "step_ms": stats.summarize([r[which]["step_ms"] for r in rounds])["median"],
            "groups": {g: stats.summarize([x[g] for x in grouped[which]])["median"]
                       for g in grouped[which][0]},
            "ops_ms": {kind: stats.summarize([r[which]["ops_ms"].get(kind, 0.0)
                                               for r in rounds])["median"] for kind in kinds}}
    result = {"model": name, "rounds": list(rounds), "load_average_before_each_round": list(loads),
              "medians": medians}
    if len(stacks) == 2:
        this, other = stacks
        per_round = list(zip(grouped[this], grouped[other]))
        result["this_over_other"] = {
            "step": stats.ratio_summary([r[this]["step_ms"] / r[other]["step_ms"]
                                          for r in rounds], SPREAD_LIMIT),
            **{g: stats.ratio_summary([a[g] / b[g] for a, b in per_round], SPREAD_LIMIT)
               for g in per_round[0][0] if all(a[g] > 0 and b[g] > 0 for a, b in per_round)}}
    return result


def run(out_dir: Path, *, models: Sequence[str], rounds: int = 3, quick: bool = False,
        python: str = sys.executable, other_python: str | None = None) -> dict[str, Any]:
    """``rounds`` interleaved rounds per model on the stack of ``python`` (and of
    ``other_python``), written to ops.json/.md/.png."""
    machine = host.machine(python)   # before the work: its load is the machine's own
    plan = dataclasses.replace(plans.QUICK if quick else plans.FULL,
                               world_sizes=(1,))
    pythons = interleave.stack_pythons(python, other_python)
    versions = {k: host.stack_versions(v) for k, v in pythons.items()}
    results = interleave.rounds_per_model(
        "ops", models, rounds, pythons,
        lambda name, work_dir, python: measure(WORKLOADS[name], plan, work_dir, python),
        summarize_model)
    result = {"benchmark": "ops", "machine": machine,
              "stacks": {k: host.stack_line(v) for k, v in versions.items()},
              "plan": {"rounds": rounds, **dataclasses.asdict(plan)}, "results": results}
    report.write_outputs(out_dir, "ops", result, markdown(result))
    plots.plot_bars(out_dir / "ops.png",
                     {f"{r['model']}, {which}": {g: ms for g, ms in
                                                 r["medians"][which]["groups"].items()
                                                 if g not in ("profiled step", "all ops")}
                      for r in results for which in pythons},
                     title="A profiled step, by where its time goes",
                     ylabel="ms per step (median over rounds)")
    return result


def markdown(result: dict[str, Any]) -> str:
    stacks = result["stacks"]
    names = list(stacks)
    two = len(names) == 2
    lines = [
        f"Plain Keras fit (no Horovod, one core, one intra-op thread), one epoch under "
        f"TensorFlow's profiler after the timed ones, {result['plan']['rounds']} interleaved "
        f"rounds; " + "; ".join(f"{k} = {line}" for k, line in stacks.items()) + ". "
        f"{host.machine_line(result['machine'])}. Milliseconds per step, medians over rounds: "
        f"the step timed without the profiler; under it, the profiled step and each op's own "
        f"time (its event less the events nested in it), grouped: TensorFlow's oneDNN kernels "
        f"(op types _Mkl*: convolutions, batch norm, matrix products), the other ops, and what "
        f"the step takes beyond its ops (the executor, the fit loop, the allocator)."
        + (f" this / other: per round, then the median (spread = (max - min) / median; "
           f"'noise' past {SPREAD_LIMIT:.0%})." if two else ""), ""]
    headers = ["model", "figure", *(f"{k} ms" for k in names)] + (["this / other"] if two
                                                                    else [])
    rows = []
    for r in result["results"]:
        figures = {"step (no profiler)": "step",
                   **{g: g for g in r["medians"][names[0]]["groups"]}}
        for label, key in figures.items():
            values = [r["medians"][k]["step_ms"] if key == "step" else
                      r["medians"][k]["groups"][key] for k in names]
            ratio = r.get("this_over_other", {}).get(key)
            rows.append([r["model"], label, *(f"{v:.2f}" for v in values)]
                        + ([stats.ratio_cell(ratio) if ratio else ""] if two else []))
    lines.append(report.markdown_table(headers, rows))
    top = []
    for r in result["results"]:
        ops = {k: r["medians"][k]["ops_ms"] for k in names}
        kinds = sorted({kind for v in ops.values() for kind in v},
                       key=lambda kind: -max(v.get(kind, 0.0) for v in ops.values()))
        for kind in kinds[:TOP_OPS]:
            values = [ops[k].get(kind, 0.0) for k in names]
            top.append([r["model"], kind, *(f"{v:.2f}" for v in values)]
                       + ([f"{values[0] / values[1]:.4f}" if values[1] else ""] if two else []))
    lines += ["", f"The {TOP_OPS} op types that take the most, per model (medians over rounds "
                  f"of each op type's own time per step"
                  + ("; the ratio of the medians" if two else "") + "):", "",
              report.markdown_table(["model", "op type", *(f"{k} ms" for k in names)]
                                    + (["this / other"] if two else []), top)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench ops

BENCHMARK = registry.Benchmark(
    name="ops", help="where a training step's time goes, op by op (TensorFlow's profiler, "
                     "plain fit, one core), this stack against --other-venv's",
    main=arguments.stack_main(run), add_arguments=arguments.add_stack_arguments)


if __name__ == "__main__":
    launch.rank_entry(sys.argv, rank_main, MODULE)
