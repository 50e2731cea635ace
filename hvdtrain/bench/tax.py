"""The wrapper's tax: hvdtrain at one rank against plain Keras ``fit`` of the same work, with no
Horovod at all, on the same core.

The plain side is what a user's own single-device script does: the same model, optimizer,
batch, thread counts and synthetic data (built by hvdtrain's model and data code, so that the
work is the same), then ``model.fit(x, y)``; one process pinned to the core that ``mpirun
--bind-to core`` gives rank 0. The hvdtrain side is ``scaling.measure`` at one rank: the real
Trainer under mpirun, its distributed optimizer, callbacks and input pipeline. Both are timed
by the same step timer (steps within an epoch; what happens between epochs, a checkpoint say,
is not in the figure). Rounds alternate the order (plain first, then hvdtrain first, ...) so
that a drift in the machine's load falls on both; the result is the median over rounds of
hvdtrain / plain with its spread. 1.0 is the ceiling of a wrapper that costs nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.bench import common, registry, scaling
from hvdtrain.errors import UserError

SPREAD_LIMIT = common.SPREAD_LIMIT


# ---------------------------------------------------------------------------------------------
# The plain side: one process, no Horovod

@dataclasses.dataclass(frozen=True)
class PlainJob:
    """One job's work set up for plain Keras ``fit`` in this process: the compiled model, its
    training arrays and how ``fit`` takes them, and what it runs on."""
    model: Any
    x: Any
    y: Any
    batch_size: int
    epochs: int
    core: int
    intra_op_threads: int
    inter_op_threads: int

    def fit(self, callbacks: Sequence[Any], epochs: int | None = None) -> None:
        """``model.fit(x, y)`` as a user's script calls it."""
        self.model.fit(self.x, self.y, batch_size=self.batch_size,
                       epochs=epochs or self.epochs, shuffle=True, verbose=0,
                       callbacks=list(callbacks))


def plain_job(options: dict[str, Any]) -> PlainJob:
    """One job's work (``scaling.job_options`` at one rank) as a user's single-device script
    sets it up, with no Horovod: pinned to the core ``mpirun --bind-to core`` gives rank 0,
    the threads, the seed, the data and the compiled model. TensorFlow imports here."""
    core = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {core})   # the core mpirun --bind-to core gives rank 0
    import tensorflow as tf
    from hvdtrain import models, placement, presets
    from hvdtrain.data import sources

    cfg = presets.build_config(options["preset"], assignments=options["assignments"])
    share = placement.threads_per_rank(*placement.cores_available(), 1)
    intra, inter = cfg.run.intra_op_threads or share, cfg.run.inter_op_threads or min(2, share)
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    dataset = sources.load(cfg.data, cfg.train.seed)
    assert isinstance(dataset.train, sources.Arrays)  # the benchmark's presets are synthetic
    model = models.build(cfg.model, dataset.input_shape, dataset.num_classes)
    models.compile_classifier(model, models.base_optimizer(cfg.optim))
    return PlainJob(model, dataset.train.x, dataset.train.y, cfg.train.batch_size,
                    cfg.train.epochs, core, intra, inter)


def plain_main(options: dict[str, Any]) -> None:
    """Plain Keras ``fit`` of one job's work (``scaling.job_options`` at one rank), timed; its
    figures written to ``options['out']`` as scaling's rank 0 writes them."""
    job = plain_job(options)
    timer = scaling.step_timer()
    job.fit([timer])
    figures = {"rank": 0, "params": int(job.model.count_params()), "cores": [job.core],
               "intra_op_threads": job.intra_op_threads,
               "inter_op_threads": job.inter_op_threads,
               **scaling.timed_repeats(timer.epochs, options["warmup_epochs"], job.batch_size),
               **scaling.step_breakdown(timer.starts, timer.epochs, options["warmup_epochs"])}
    Path(options["out"]).write_text(json.dumps({"ranks": [figures]}))


def measure_plain(workload: scaling.Workload, plan: scaling.Plan, work_dir: Path,
                  python: str = sys.executable,
                  assignments: Sequence[str] = ()) -> tuple[float, dict[str, Any]]:
    """Plain ``fit``'s median samples/s over the plan's timed repeats, and its raw figures
    (the model's parameter count, the step breakdown); ``assignments``: config settings on top
    of the workload's."""
    options = scaling.job_options(workload, 1, plan, work_dir)
    options["assignments"] += list(assignments)
    command = common.rank_argv("hvdtrain.bench.tax", options, python)
    output = common.run_job(command, what=f"plain fit of {workload.name}")
    raw = common.read_json_output(Path(options["out"]), f"plain fit of {workload.name}",
                                  output)
    return common.summarize(scaling.repeat_rates(raw["ranks"]))["median"], raw["ranks"][0]


def measure_hvdtrain(workload: scaling.Workload, plan: scaling.Plan, work_dir: Path,
                     python: str = sys.executable) -> tuple[float, dict[str, Any], str, dict]:
    """hvdtrain's median samples/s at one rank (mpirun, one core), its rank's raw figures (the
    model's parameter count, the step breakdown), the stack, and the launch settings the rank
    found (rank_env)."""
    row = scaling.measure(workload, 1, plan, work_dir, python=python)
    return row["total_samples_per_sec"]["median"], row["raw"][0], row["stack"], row["rank_env"]


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

TARGET = 0.98   # issue 28: hvdtrain at one rank >= 0.98x plain fit, on both stacks
PLAN_WORLD_SIZES = (1,)   # the tax is measured at one rank alone


def ratio_summary(rounds: Sequence[dict[str, float]], top: str = "hvdtrain",
                  bottom: str = "plain") -> dict[str, Any]:
    """``top`` / ``bottom`` (hvdtrain / plain by default) per round, their median and spread,
    and whether that is noise."""
    return common.ratio_summary([r[top] / r[bottom] for r in rounds], SPREAD_LIMIT)


def round_order(round_index: int, stacks: Sequence[str]) -> list[tuple[str, str]]:
    """The (stack, side) measurements of one round: every stack's plain fit and hvdtrain, in
    the reverse order every other round, so that a drift in the machine's load falls on all."""
    order = [(stack, side) for stack in stacks for side in ("plain", "hvdtrain")]
    return order if round_index % 2 == 0 else order[::-1]


def measure_rounds(name: str, rounds: int, pythons: dict[str, str], plan: scaling.Plan,
                   tmp: Path, stack_of: dict[str, str]
                   ) -> tuple[dict[str, list[dict[str, Any]]], list[float]]:
    """Model ``name``'s interleaved rounds: per stack (a key of ``pythons``), one row per round
    holding plain fit's and hvdtrain's samples/s (and what each trained and ran with), and the
    load average before each round. ``stack_of`` takes each stack's version line."""
    workload, loads = scaling.WORKLOADS[name], []
    measured: dict[str, list[dict[str, Any]]] = {k: [] for k in pythons}
    for i in range(rounds):
        loads.append(common.load_average())
        rows: dict[str, dict[str, Any]] = {k: {} for k in pythons}
        for which, side in round_order(i, list(pythons)):
            common.say(f"tax: {name}, round {i + 1}/{rounds}, {which} stack, {side}...")
            row = rows[which]
            if side == "plain":
                record(row, side, *measure_plain(workload, plan, tmp, pythons[which]))
            else:
                rate, raw, stack_of[which], row["hvdtrain_rank_env"] = measure_hvdtrain(
                    workload, plan, tmp, pythons[which])
                record(row, side, rate, raw)
        for which in pythons:
            measured[which].append(rows[which])
    return measured, loads


def run(out_dir: Path, *, models: Sequence[str], rounds: int = 3, quick: bool = False,
        python: str = sys.executable, other_python: str | None = None) -> dict[str, Any]:
    """``rounds`` interleaved rounds per model on the stack of ``python`` (and of
    ``other_python``, measured in the same rounds: both stacks' tax, and each stack's plain fit
    and hvdtrain against the other's), written to tax.json/.md/.png (tax-keras2.* and so on
    when ``python`` is another venv's interpreter and there is no other)."""
    machine = common.machine(python)   # before the work: its load is the machine's own
    plan = dataclasses.replace(scaling.QUICK if quick else scaling.FULL,
                               world_sizes=PLAN_WORLD_SIZES)
    pythons = common.stack_pythons(python, other_python)
    versions = {k: common.stack_versions(v) for k, v in pythons.items()}
    results: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    stack_of = dict.fromkeys(pythons, "")
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for name in models:
            workload = scaling.WORKLOADS[name]
            measured, loads = measure_rounds(name, rounds, pythons, plan, Path(tmp), stack_of)
            for which in pythons:
                results.append({"model": name, "stack": stack_name(stack_of[which]),
                                "stack_line": stack_of[which], "which": which,
                                "batch_size": workload.batch_size,
                                "image_shape": list(workload.image_shape),
                                "rounds": measured[which],
                                "load_average_before_each_round": loads,
                                "hvdtrain_over_plain": ratio_summary(measured[which])})
            if other_python:
                comparisons.append({"model": name, **{
                    f"{side}_this_over_other": common.ratio_summary(
                        [a[side] / b[side] for a, b in zip(measured["this"], measured["other"])],
                        SPREAD_LIMIT) for side in ("plain", "hvdtrain")}})
    result = {"benchmark": "tax", "machine": machine, "stack": stack_of["this"],
              "stacks": {k: {"line": stack_of[k], "name": stack_name(stack_of[k]),
                             "versions": versions[k]} for k in pythons},
              "plan": {"rounds": rounds, **asdict(plan)}, "target": TARGET,
              "results": results, "stack_comparisons": comparisons}
    # Another venv's stack alone: tax-keras2.* next to tax.*.
    name = ("tax" if python == sys.executable or other_python
            else f"tax-{stack_name(stack_of['this'])}")
    common.write_outputs(out_dir, name, result, markdown(result))
    common.plot_bars(out_dir / f"{name}.png",
                     {model: {f"{r['stack']}: hvdtrain / plain fit":
                              r["hvdtrain_over_plain"]["median"] for r in results
                              if r["model"] == model} for model in models},
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
                     f"{common.summarize(plain)['median']:,.2f}",
                     f"{common.summarize(mine)['median']:,.2f}",
                     common.ratio_cell(r["hvdtrain_over_plain"], result["target"]),
                     ", ".join(f"{x:.2f}" for x in r["load_average_before_each_round"])])
    lines = [
        f"hvdtrain at 1 rank (mpirun, one core) against plain Keras fit (no Horovod, the same "
        f"core), {result['plan']['rounds']} interleaved rounds; "
        f"{common.machine_line(result['machine'])}. Ratio: median over rounds of hvdtrain / "
        f"plain (spread = (max - min) / median; 'noise' past {SPREAD_LIMIT:.0%}); target: "
        f">= {result['target']:g}.", "",
        common.markdown_table(["model", "stack", "batch", "plain fit samples/s",
                               "hvdtrain samples/s", "hvdtrain / plain",
                               "load before each round"], rows)]
    breakdown = breakdown_rows(result["results"])
    if breakdown:
        lines += ["", "Where a step's time goes, each side's median over its timed steps, then "
                      "the median over rounds: the step (one step's end to the next), and of it "
                      "the time between steps (the fit loop and the callbacks' hooks, outside "
                      "the train function).", "",
                  common.markdown_table(["model", "stack", "plain fit step ms",
                                         "hvdtrain step ms", "plain fit between steps ms",
                                         "hvdtrain between steps ms"], breakdown)]
    if result.get("stack_comparisons"):
        stacks = result["stacks"]
        this, other = stacks["this"]["name"], stacks["other"]["name"]
        lines += ["", f"The same rounds, {this} ({stacks['this']['line']}) over {other} "
                      f"({stacks['other']['line']}): plain fit against plain fit is the "
                      f"TensorFlow/Keras version's own difference, with no hvdtrain and no "
                      f"Horovod; hvdtrain against hvdtrain at one rank (target >= "
                      f"{result['target']:g}).", "",
                  common.markdown_table(
                      ["model", f"plain fit, {this} / {other}", f"hvdtrain, {this} / {other}"],
                      [[c["model"], common.ratio_cell(c["plain_this_over_other"]),
                        common.ratio_cell(c["hvdtrain_this_over_other"], result["target"])]
                       for c in result["stack_comparisons"]])]
    return "\n".join(lines)


def breakdown_rows(results: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """The step breakdown's table rows (milliseconds); none where a round lacks it."""
    rows = []
    for r in results:
        if not all(f"{side}_step" in x for x in r["rounds"] for side in ("plain", "hvdtrain")):
            continue
        cells = [common.summarize([x[f"{side}_step"][key] * 1e3 for x in r["rounds"]])["median"]
                 for key in BREAKDOWN for side in ("plain", "hvdtrain")]
        rows.append([r["model"], r["stack"], *(f"{ms:.3f}" if ms < 1 else f"{ms:.2f}"
                                                for ms in cells)])
    return rows


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench tax

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench tax's options (bench all's too)."""
    parser.add_argument("--models", default=None,
                        help="comma list of mobilenetv2, resnet_small, mlp (default: "
                             "mobilenetv2,resnet_small; --quick: mlp)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per model (default 3; --quick: 2)")
    parser.add_argument("--venv", type=Path, default=None,
                        help="measure the stack of this virtualenv (e.g. .venv-keras2) instead "
                             "of this one")
    add_other_venv(parser)


def add_other_venv(parser: argparse.ArgumentParser) -> None:
    """--other-venv, shared by tax, stacks and peers (bench all takes it once)."""
    parser.add_argument("--other-venv", type=Path, default=None,
                        help="the other stack's virtualenv (e.g. .venv-keras2), measured in the "
                             "same interleaved rounds")


def venv_python(venv: Path | None, option: str) -> str | None:
    """The interpreter of ``venv`` (None: None); UserError when it has none."""
    if venv is None:
        return None
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        raise UserError(f"{python} not found: {option} takes a virtualenv made by "
                        f"'make install STACK=...', e.g. .venv-keras2")
    return str(python)


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench tax``; UserError when --venv or --other-venv has no Python or a model
    is unknown."""
    run(Path(args.out), **stack_choice(args))


def stack_choice(args: argparse.Namespace) -> dict[str, Any]:
    """What ``add_arguments``' options chose, as tax's, ops' and phases' ``run`` take it: the
    models, rounds, --quick, this stack's interpreter and the other's."""
    return {"models": scaling.model_names(args.models, args.quick),
            "rounds": args.rounds or (2 if args.quick else 3), "quick": args.quick,
            "python": venv_python(args.venv, "--venv") or sys.executable,
            "other_python": venv_python(args.other_venv, "--other-venv")}


BENCHMARK = registry.Benchmark(
    name="tax", help="hvdtrain at one rank against plain Keras fit of the same work with no "
                     "Horovod (the wrapper's cost), interleaved rounds",
    main=main, add_arguments=add_arguments,
    title="The wrapper's tax: hvdtrain at one rank against plain Keras fit")


if __name__ == "__main__":
    common.rank_entry(sys.argv, plain_main, "hvdtrain.bench.tax")
