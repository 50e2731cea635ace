"""Throughput against world size (weak scaling), and hvdtrain against Horovod's own benchmark.

Each world size N is its own launch (``mpirun -np N --bind-to core`` by default: one core per
rank at every N, so that N=1 and N=2 are comparable). Every rank trains through hvdtrain's real
``Trainer`` on synthetic data, with hvdtrain's default launch settings, and times its own
steps. An epoch is one timed repeat: its first step (after the previous epoch's checkpoint and
metric averaging) starts the clock, its last step stops it, and the first epochs are warmup
(tracing, memory growth). Each rank counts its own samples; rank 0 gathers every rank's counts
and times, so the total rate is (sum of samples over ranks) / (slowest rank's time) for each
repeat, never rank 0's rate times N. Weak-scaling efficiency is T_N / (N * T_1) on medians.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from hvdtrain import launchers
from hvdtrain.bench import common, registry
from hvdtrain.errors import UserError


@dataclass(frozen=True)
class Workload:
    """One model to scale: an hvdtrain preset with its per-rank batch and input."""
    name: str
    preset: str
    batch_size: int
    image_shape: tuple[int, ...]
    num_classes: int = 10


WORKLOADS = {
    # Compute-bound on a CPU core: the benchmark model of Horovod's synthetic benchmark, at a
    # CPU-sized 64x64 input (about 1 s per step of 16 on one core here).
    "mobilenetv2": Workload("mobilenetv2", "synthetic-mobilenetv2", 16, (64, 64, 3)),
    # CIFAR-sized ResNet: fewer parameters to reduce, more compute per parameter.
    "resnet_small": Workload("resnet_small", "synthetic-resnet", 32, (32, 32, 3)),
    # Tiny and communication-bound: the worst case for scaling; seconds per run (--quick).
    "mlp": Workload("mlp", "synthetic-mlp", 32, (8, 8, 1)),
}


@dataclass(frozen=True)
class Plan:
    world_sizes: tuple[int, ...] = (1, 2)
    warmup_epochs: int = 1
    repeats: int = 5
    steps_per_repeat: int = 8       # timed steps per repeat (each epoch runs one more)
    launcher: launchers.Launcher = "mpi"

    @property
    def epochs(self) -> int:
        return self.warmup_epochs + self.repeats


FULL = Plan()
QUICK = Plan(warmup_epochs=1, repeats=3, steps_per_repeat=5)
# The plain fit row's model as Keras builds it: Keras 3's own BatchNormalization ops.
PLAIN_KERAS = ("model.fused_batch_norm=false",)


# ---------------------------------------------------------------------------------------------
# Pure arithmetic (tested without MPI)

def repeat_rates(per_rank: Sequence[dict]) -> list[float]:
    """Total samples/s per repeat: the samples every rank counted, over the slowest rank's
    time for that repeat. ``per_rank[r]`` = {"samples": [...], "seconds": [...]}."""
    repeats = {len(r["seconds"]) for r in per_rank} | {len(r["samples"]) for r in per_rank}
    if len(repeats) != 1:
        raise ValueError(f"ranks timed different numbers of repeats: {sorted(repeats)}")
    count = repeats.pop()
    return [sum(r["samples"][i] for r in per_rank) / max(r["seconds"][i] for r in per_rank)
            for i in range(count)]


def weak_scaling_efficiency(rate_n: float, ranks: int, rate_1: float) -> float:
    """T_N / (N * T_1): 1.0 when N ranks do N times the work of one in the same time."""
    return rate_n / (ranks * rate_1)


def synthetic_sizes(ranks: int, batch_size: int, steps_per_epoch: int) -> tuple[int, float]:
    """(data.num_samples, data.eval_fraction) that give each of ``ranks`` ranks exactly
    ``steps_per_epoch`` full batches, with one batch per rank held out for eval."""
    train = ranks * batch_size * steps_per_epoch
    held_out = ranks * batch_size
    return train + held_out, held_out / (train + held_out)


# A check of the benchmark itself (its tests set it): "RANK:SECONDS" makes that rank sleep
# before each of its steps, as a slow rank would; the total rate and efficiency must fall.
SLOW_RANK_ENV = "HVDTRAIN_BENCH_SLOW_RANK"


def slow_rank_delay(value: str, rank: int) -> float:
    """Seconds this ``rank`` sleeps before each step under SLOW_RANK_ENV=``value`` (0: none)."""
    if not value:
        return 0.0
    slow, _, seconds = value.partition(":")
    return float(seconds) if int(slow) == rank else 0.0


# ---------------------------------------------------------------------------------------------
# Rank side

def step_timer(delay_s: float = 0.0):
    """A Keras callback that records, per epoch, when each training step starts and ends; it
    sleeps ``delay_s`` before each step (a slow rank, see SLOW_RANK_ENV). TensorFlow imports
    here."""
    import tensorflow as tf

    class StepTimer(tf.keras.callbacks.Callback):
        """Each epoch: when each of this rank's steps started (after the earlier callbacks'
        batch-begin hooks and the delay) and when it ended."""

        def __init__(self) -> None:
            super().__init__()
            self.epochs: list[list[float]] = []
            self.starts: list[list[float]] = []

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.epochs.append([])
            self.starts.append([])

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            if delay_s:
                time.sleep(delay_s)
            self.starts[-1].append(time.perf_counter())

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.epochs[-1].append(time.perf_counter())
    return StepTimer()


def timed_repeats(epochs: list[list[float]], warmup: int, batch_size: int
                  ) -> dict[str, list[float]]:
    """A step timer's epochs past ``warmup``: each repeat's seconds (first step's end to last
    step's end) and the samples its steps after the first trained."""
    timed = epochs[warmup:]
    return {"seconds": [steps[-1] - steps[0] for steps in timed],
            "samples": [(len(steps) - 1) * batch_size for steps in timed]}


def step_breakdown(starts: list[list[float]], ends: list[list[float]], warmup: int
                   ) -> dict[str, float]:
    """Where a step's time goes, from a step timer's epochs past ``warmup``: the median step
    (one end to the next) and, of it, the median time between steps (one step's end to the
    next one's start: the loop and the callbacks' hooks, not the train function)."""
    steps, between = [], []
    for begun, ended in zip(starts[warmup:], ends[warmup:]):
        steps += [b - a for a, b in zip(ended, ended[1:])]
        between += [b - a for a, b in zip(ended, begun[1:])]
    if not steps:
        raise ValueError("no timed epoch has two steps")
    return {"step_seconds_median": statistics.median(steps),
            "between_steps_seconds_median": statistics.median(between)}


def rank_main(options: dict[str, Any]) -> None:
    """One rank of one launch: train ``options['epochs']`` epochs, time each, and have rank 0
    write every rank's figures to ``options['out']``."""
    pinned = (None if launchers.entry(options["launcher"]).binds_cores
              else common.pin_to_own_core())
    import os
    from hvdtrain import presets, trainer
    from hvdtrain import distributed as dist  # TensorFlow and Horovod load here

    cfg = presets.build_config(options["preset"], assignments=options["assignments"])
    world = dist.init(device="cpu", intra_op_threads=cfg.run.intra_op_threads,
                      inter_op_threads=cfg.run.inter_op_threads)
    timer = step_timer(slow_rank_delay(os.environ.get(SLOW_RANK_ENV, ""), world.rank))
    summary = trainer.Trainer(cfg, world, extra_callbacks=[timer]).train()

    mine = {"rank": world.rank, "params": summary["params"],
            **timed_repeats(timer.epochs, options["warmup_epochs"], cfg.train.batch_size),
            **step_breakdown(timer.starts, timer.epochs, options["warmup_epochs"]),
            "cores": sorted(os.sched_getaffinity(0)), "pinned_by_hvdtrain_bench": pinned,
            "intra_op_threads": world.intra_op_threads,
            "inter_op_threads": world.inter_op_threads,
            "env": {k: os.environ.get(k) for k in
                    ("OMPI_MCA_mpi_yield_when_idle", "HOROVOD_CYCLE_TIME",
                     "HOROVOD_FUSION_THRESHOLD")}}
    everyone = dist.allgather_object(mine)  # Horovod: every rank's own counts and times
    if world.is_chief:
        Path(options["out"]).write_text(json.dumps({"controller": world.controller,
                                                    "stack": world.stack, "ranks": everyone}))


# ---------------------------------------------------------------------------------------------
# Driver

def job_options(workload: Workload, ranks: int, plan: Plan, work_dir: Path) -> dict[str, Any]:
    """What every process of one measured job of ``ranks`` ranks reads: the preset and its
    settings (each rank ``plan.steps_per_repeat`` + 1 full batches an epoch), the warmup, and
    the file rank 0 writes the figures to."""
    steps = plan.steps_per_repeat + 1
    num_samples, eval_fraction = synthetic_sizes(ranks, workload.batch_size, steps)
    run_dir = work_dir / f"{workload.name}-{ranks}-{time.monotonic_ns()}"
    assignments = [f"train.batch_size={workload.batch_size}", f"train.epochs={plan.epochs}",
                   "train.eval_every=0", f"data.num_samples={num_samples}",
                   f"data.eval_fraction={eval_fraction!r}",
                   "data.image_shape=" + ",".join(map(str, workload.image_shape)),
                   f"data.num_classes={workload.num_classes}",
                   "run.export=false", "run.tensorboard=false", "run.progress_every_s=0",
                   f"run.run_dir={run_dir}"]
    return {"preset": workload.preset, "assignments": assignments,
            "out": str(run_dir.with_suffix(".json")), "warmup_epochs": plan.warmup_epochs,
            "launcher": plan.launcher}


def measure(workload: Workload, ranks: int, plan: Plan, work_dir: Path,
            python: str = sys.executable) -> dict[str, Any]:
    """One launch of ``ranks`` ranks on ``workload``: the per-rank figures and the totals.
    ``python``: the interpreter (and so the stack) the ranks run on."""
    options = job_options(workload, ranks, plan, work_dir)
    out = Path(options["out"])
    command = common.launch_command(plan.launcher, ranks,
                                    common.rank_argv("hvdtrain.bench.scaling", options,
                                                     python))
    output = common.run_job(command, what=f"scaling {workload.name} on {ranks} ranks")
    raw = common.read_json_output(out, f"scaling {workload.name} on {ranks} ranks", output)
    rates = repeat_rates(raw["ranks"])
    per_rank = [r["samples"][i] / r["seconds"][i] for r in raw["ranks"]
                for i in range(len(r["seconds"]))]
    return {"model": workload.name, "ranks": ranks, "controller": raw["controller"],
            "stack": raw["stack"],
            "launcher": plan.launcher, "batch_size_per_rank": workload.batch_size,
            "image_shape": list(workload.image_shape),
            "total_samples_per_sec": common.summarize(rates),
            "per_rank_samples_per_sec": common.summarize(per_rank),
            "core_budget": [{"rank": r["rank"], "cores": r["cores"],
                             "intra_op_threads": r["intra_op_threads"],
                             "inter_op_threads": r["inter_op_threads"]}
                            for r in raw["ranks"]],
            "rank_env": raw["ranks"][0]["env"], "raw": raw["ranks"]}


# N ranks on N cores cannot do more than N times one rank's work: an efficiency above this is
# noise (a disturbed 1-rank run, say), flagged in the result and the table, not scaling.
EFFICIENCY_CEILING = 1.05


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
            r["weak_scaling_efficiency"] = weak_scaling_efficiency(
                r["total_samples_per_sec"]["median"], r["ranks"], base[r["model"]])
            r["efficiency_above_ceiling"] = r["weak_scaling_efficiency"] > EFFICIENCY_CEILING


EFFICIENCY_TARGET = 0.95   # issue 28, item 3: at 2 ranks on MobileNetV2 and resnet_small


def efficiency_cell(row: dict) -> Any:
    """The efficiency of ``row`` for a table, marked as noise when above the ceiling."""
    e = row.get("weak_scaling_efficiency")
    if e is None:
        return None
    if row.get("efficiency_above_ceiling"):
        return f"{e:.4f} (above {EFFICIENCY_CEILING}: noise)"
    if row["ranks"] == 1:
        return f"{e:.4f}"
    return f"{e:.4f}: {common.verdict(e, EFFICIENCY_TARGET)}"


def run(out_dir: Path, *, models: Sequence[str], plan: Plan,
        versus: dict[str, Any]) -> dict[str, Any]:
    """Every model at every world size; ``versus`` is the comparison with Horovod's own
    benchmark (versus_horovod.run), reported beside the rows."""
    from hvdtrain.bench import tax  # the plain baseline (tax imports this module)
    machine = common.machine()   # before the work: its load is the machine's own
    rows: list[dict] = []
    plain_fit: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for name in models:
            for ranks in plan.world_sizes:
                common.say(f"scaling: {name} on {ranks} rank(s) ({plan.launcher})...")
                row = measure(WORKLOADS[name], ranks, plan, Path(tmp))
                rows.append(row)
                common.say(f"  {row['total_samples_per_sec']['median']:,.1f} samples/s total "
                           f"(spread {row['total_samples_per_sec']['spread']:.1%})")
            # The plain baseline: Keras fit with no Horovod, one process on one core, the
            # same plan, the model as Keras builds it (PLAIN_KERAS: what a user's own script
            # trains); bench tax's plain side, whose interleaved rounds against hvdtrain with
            # the same layers on both sides are the wrapper's own cost. It is set beside the
            # 1-rank row: without one, there is nothing to set it beside.
            if 1 in plan.world_sizes:
                common.say(f"scaling: {name}, plain Keras fit (no Horovod, one core)...")
                plain_fit[name], _ = tax.measure_plain(WORKLOADS[name], plan, Path(tmp),
                                                       assignments=PLAIN_KERAS)
        add_efficiency(rows, plain_fit)
    result = {"benchmark": "scaling", "machine": machine, "plan": asdict(plan),
              "results": rows, "plain_fit_samples_per_sec": plain_fit,
              "versus_horovod_synthetic": versus}
    common.write_outputs(out_dir, "scaling", result, markdown(result))
    plot(out_dir, result)
    return result


def markdown(result: dict) -> str:
    plan = result["plan"]
    lines = [f"Weak scaling, {plan['launcher']} launcher, one core per rank, "
             f"{plan['repeats']} timed repeats of {plan['steps_per_repeat']} steps after "
             f"{plan['warmup_epochs']} warmup epoch(s); median (min..max).", ""]
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
    lines.append(common.markdown_table(
        ["model", "ranks", "batch/rank", "samples/s total", "samples/s per rank",
         "efficiency", "budget per rank"], rows))
    lines += ["", "The plain fit row: Keras `model.fit` of the same model, batch, threads and "
                  "data with no Horovod, one process on one core, the model as Keras builds it "
                  "(on Keras 3, its own BatchNormalization ops: `model.fused_batch_norm=false`), "
                  "measured once in this run: what a script of your own gets. The wrapper's "
                  "own cost, with the same layers on both sides, over interleaved rounds with "
                  "its spread, is bench tax's. Each world size runs once here; bench stacks "
                  "measures each stack's 2-rank efficiency over interleaved rounds, with its "
                  "spread."]
    lines += ["", versus_markdown(result["versus_horovod_synthetic"])]
    return "\n".join(lines)


def versus_markdown(result: dict[str, Any]) -> str:
    """The comparison with Horovod's TF2 synthetic benchmark (versus_horovod.run)."""
    if "skipped" in result:
        return f"Versus Horovod's TF2 synthetic benchmark: skipped ({result['skipped']})."
    rows = []
    for r in result["results"]:
        efficiency = {side: common.ratio_text(r[f"{side}_efficiency"])
                      if f"{side}_efficiency" in r else "" for side in ("horovod", "hvdtrain")}
        rows.append([r["ranks"], f"{r['horovod_total_img_per_sec']['median']:,.2f}",
                     efficiency["horovod"], f"{r['hvdtrain_total_img_per_sec']['median']:,.2f}",
                     efficiency["hvdtrain"], common.ratio_cell(r["ratio"], r["target"])])
    versions = result["versions"]
    loads = ", ".join(f"{x:.2f}" for x in result["load_average_before_each_round"])
    return "\n".join([
        f"Versus Horovod's TF2 synthetic benchmark ({result['model']}, batch "
        f"{result['batch_size_per_rank']} per rank, {result['launch']}, each with its own "
        f"defaults; hvdtrain on {common.stack_line(versions['hvdtrain'])}, Horovod's script on "
        f"{common.stack_line(versions['horovod'])}; {result['plan']['rounds']} interleaved "
        f"rounds, each side's figure the median of {result['plan']['repeats']} repeats, then "
        f"the median over rounds; efficiencies and ratios per round, median (spread); load "
        f"before each round: {loads}):", "",
        common.markdown_table(["ranks", "Horovod img/s", "Horovod efficiency",
                               "hvdtrain img/s", "hvdtrain efficiency", "hvdtrain / Horovod"],
                              rows)])


def plot(out_dir: Path, result: dict) -> None:
    series = {}
    for r in result["results"]:
        xs, ys = series.setdefault(r["model"], ([], []))
        xs.append(r["ranks"])
        ys.append(r.get("weak_scaling_efficiency", math.nan))
    sizes = sorted({r["ranks"] for r in result["results"]})
    common.plot_lines(out_dir / "scaling.png", series, title="Weak-scaling efficiency",
                      xlabel="ranks (one core each)", ylabel="T_N / (N * T_1)",
                      reference=(sizes, [1.0] * len(sizes)), reference_label="ideal")


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench scaling

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench scaling's options (bench all's too)."""
    parser.add_argument("--models", default=None,
                        help="comma list of mobilenetv2, resnet_small, mlp (default: "
                             "mobilenetv2,resnet_small; --quick: mlp)")
    parser.add_argument("--world-sizes", default="1,2", help="comma list (default 1,2)")
    parser.add_argument("--launcher", choices=launchers.MULTI_RANK, default="mpi",
                        help="a multi-rank launcher of hvdtrain/launchers.py (default mpi: "
                             "mpirun --bind-to core; gloo: horovodrun)")
    parser.add_argument("--horovod-synthetic", metavar="PATH", type=Path,
                        help="Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark"
                             ".py: also compare with it (skipped when absent)")
    parser.add_argument("--horovod-venv", metavar="VENV", type=Path, default=None,
                        help="run Horovod's script with this virtualenv's Python (e.g. "
                             ".venv-keras2: it cannot run on Keras 3); hvdtrain runs on this "
                             "one's")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds (default: each benchmark's own)")


def world_sizes(text: str) -> tuple[int, ...]:
    """--world-sizes ``text``, a comma list of positive integers such as 1,2, as a tuple;
    UserError otherwise."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise UserError(f"--world-sizes={text!r}: expected positive integers such as 1,2")
    return values


def model_names(text: str | None, quick: bool) -> list[str]:
    """The WORKLOADS named by the comma list ``text`` (None: the default for ``quick``);
    UserError on a name that is not one."""
    names = (text or ("mlp" if quick else "mobilenetv2,resnet_small")).split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise UserError(f"unknown benchmark model {unknown[0]!r}; choose from "
                        f"{', '.join(WORKLOADS)}")
    return names


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench scaling``: the plan from the options, Horovod's own benchmark beside
    it when --horovod-synthetic names it, then every model at every world size."""
    from hvdtrain.bench import versus_horovod  # it imports this module
    base = QUICK if args.quick else FULL
    plan = Plan(world_sizes=world_sizes(args.world_sizes),
                warmup_epochs=base.warmup_epochs, repeats=base.repeats,
                steps_per_repeat=base.steps_per_repeat, launcher=args.launcher)
    from hvdtrain.bench import tax
    horovod_python = tax.venv_python(args.horovod_venv, "--horovod-venv") or sys.executable
    versus = versus_horovod.run(args.horovod_synthetic, quick=args.quick,
                                horovod_python=horovod_python, rounds=args.rounds)
    run(Path(args.out), models=model_names(args.models, args.quick), plan=plan, versus=versus)


BENCHMARK = registry.Benchmark(
    name="scaling", help="throughput and weak-scaling efficiency against world size",
    main=main, add_arguments=add_arguments, title="Throughput against world size")


if __name__ == "__main__":
    common.rank_entry(sys.argv, rank_main, "hvdtrain.bench.scaling")
