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
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.bench import common, registry, scaling
from hvdtrain.errors import UserError

SPREAD_LIMIT = 0.10  # a ratio whose rounds spread wider than this is noise, not a result


# ---------------------------------------------------------------------------------------------
# The plain side: one process, no Horovod

def plain_main(options: dict[str, Any]) -> None:
    """Plain Keras ``fit`` of one job's work (``scaling.job_options`` at one rank), timed; its
    figures written to ``options['out']`` as scaling's rank 0 writes them."""
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
    timer = scaling.step_timer()
    model.fit(dataset.train.x, dataset.train.y, batch_size=cfg.train.batch_size,
              epochs=cfg.train.epochs, shuffle=True, verbose=0, callbacks=[timer])
    figures = {"rank": 0, "params": int(model.count_params()), "cores": [core],
               "intra_op_threads": intra, "inter_op_threads": inter,
               **scaling.timed_repeats(timer.epochs, options["warmup_epochs"],
                                       cfg.train.batch_size)}
    Path(options["out"]).write_text(json.dumps({"ranks": [figures]}))


def measure_plain(workload: scaling.Workload, plan: scaling.Plan, work_dir: Path,
                  python: str = sys.executable) -> tuple[float, int]:
    """Plain ``fit``'s median samples/s over the plan's timed repeats, and the model's
    parameter count."""
    options = scaling.job_options(workload, 1, plan, work_dir)
    command = common.rank_argv("hvdtrain.bench.tax", options, python)
    output = common.run_job(command, what=f"plain fit of {workload.name}")
    raw = common.read_json_output(Path(options["out"]), f"plain fit of {workload.name}",
                                  output)
    return (common.summarize(scaling.repeat_rates(raw["ranks"]))["median"],
            raw["ranks"][0]["params"])


def measure_hvdtrain(workload: scaling.Workload, plan: scaling.Plan, work_dir: Path,
                     python: str = sys.executable) -> tuple[float, int, str, dict]:
    """hvdtrain's median samples/s at one rank (mpirun, one core), the model's parameter
    count, the stack, and the launch settings the rank found (rank_env)."""
    row = scaling.measure(workload, 1, plan, work_dir, python=python)
    return (row["total_samples_per_sec"]["median"], row["raw"][0]["params"], row["stack"],
            row["rank_env"])


def stack_name(stack: str) -> str:
    """``keras3`` or ``keras2`` from a rank's stack line ('tensorflow X, keras 3.15.1, ...')."""
    keras = stack.split("keras ", 1)[1] if "keras " in stack else "?"
    return f"keras{keras.split('.', 1)[0]}"


# ---------------------------------------------------------------------------------------------
# The driver

def ratio_summary(rounds: Sequence[dict[str, float]]) -> dict[str, Any]:
    """hvdtrain / plain: per round, their median and spread, and whether that is noise."""
    per_round = [r["hvdtrain"] / r["plain"] for r in rounds]
    summary = common.summarize(per_round)
    return {**summary, "per_round": per_round, "noise": summary["spread"] > SPREAD_LIMIT}


def run(out_dir: Path, *, models: Sequence[str], rounds: int = 4, quick: bool = False,
        python: str = sys.executable) -> dict[str, Any]:
    """``rounds`` interleaved rounds per model on the stack of ``python``, written to
    tax.json/.md/.png (tax-keras2.* and so on for another venv's interpreter)."""
    machine = common.machine()   # before the work: its load is the machine's own
    plan = scaling.QUICK if quick else scaling.FULL
    results: list[dict[str, Any]] = []
    stack = ""
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for name in models:
            workload, measured, loads = scaling.WORKLOADS[name], [], []
            for i in range(rounds):
                order = ("plain", "hvdtrain") if i % 2 == 0 else ("hvdtrain", "plain")
                loads.append(common.load_average())
                row: dict[str, Any] = {}
                for which in order:
                    common.say(f"tax: {name}, round {i + 1}/{rounds}, {which}...")
                    if which == "plain":
                        row["plain"], row["plain_params"] = measure_plain(
                            workload, plan, Path(tmp), python)
                    else:
                        (row["hvdtrain"], row["hvdtrain_params"], stack,
                         row["hvdtrain_rank_env"]) = measure_hvdtrain(workload, plan, Path(tmp),
                                                                      python)
                measured.append(row)
            results.append({"model": name, "batch_size": workload.batch_size,
                            "image_shape": list(workload.image_shape), "rounds": measured,
                            "load_average_before_each_round": loads,
                            "hvdtrain_over_plain": ratio_summary(measured)})
    result = {"benchmark": "tax", "machine": machine, "stack": stack,
              "plan": {"rounds": rounds, **asdict(plan)}, "results": results}
    # Another venv's stack beside this one's: tax-keras2.* next to tax.*.
    name = "tax" if python == sys.executable else f"tax-{stack_name(stack)}"
    common.write_outputs(out_dir, name, result, markdown(result))
    common.plot_bars(out_dir / f"{name}.png",
                     {r["model"]: {"hvdtrain / plain fit": r["hvdtrain_over_plain"]["median"]}
                      for r in results},
                     title=f"hvdtrain at one rank against plain Keras fit ({stack_name(stack)})",
                     ylabel="samples/s ratio (median over rounds)", reference=1.0,
                     reference_label="no tax")
    return result


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for r in result["results"]:
        ratio = r["hvdtrain_over_plain"]
        plain = [x["plain"] for x in r["rounds"]]
        mine = [x["hvdtrain"] for x in r["rounds"]]
        rows.append([r["model"], r["batch_size"], f"{common.summarize(plain)['median']:,.2f}",
                     f"{common.summarize(mine)['median']:,.2f}",
                     f"{ratio['median']:.3f} (spread {ratio['spread']:.0%})"
                     + (" noise" if ratio["noise"] else ""),
                     ", ".join(f"{x:.2f}" for x in r["load_average_before_each_round"])])
    return "\n".join([
        f"hvdtrain at 1 rank (mpirun, one core) against plain Keras fit (no Horovod, the same "
        f"core), {result['plan']['rounds']} interleaved rounds; {result['stack']}; "
        f"{common.machine_line(result['machine'])}. Ratio: median over rounds of hvdtrain / "
        f"plain (spread = (max - min) / median; 'noise' past {SPREAD_LIMIT:.0%}).", "",
        common.markdown_table(["model", "batch", "plain fit samples/s", "hvdtrain samples/s",
                               "hvdtrain / plain", "load before each round"], rows)])


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench tax

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench tax's options (bench all's too)."""
    parser.add_argument("--models", default=None,
                        help="comma list of mobilenetv2, resnet_small, mlp (default: "
                             "mobilenetv2,resnet_small; --quick: mlp)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per model (default 4; --quick: 2)")
    parser.add_argument("--venv", type=Path, default=None,
                        help="measure the stack of this virtualenv (e.g. .venv-keras2) instead "
                             "of this one")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench tax``; UserError when --venv has no Python or a model is unknown."""
    python = sys.executable
    if args.venv is not None:
        python = str(args.venv / "bin" / "python")
        if not Path(python).exists():
            raise UserError(f"{python} not found: --venv takes a virtualenv made by "
                            f"'make install STACK=...', e.g. .venv-keras2")
    rounds = args.rounds or (2 if args.quick else 4)
    run(Path(args.out), models=scaling.model_names(args.models, args.quick), rounds=rounds,
        quick=args.quick, python=python)


BENCHMARK = registry.Benchmark(
    name="tax", help="hvdtrain at one rank against plain Keras fit of the same work with no "
                     "Horovod (the wrapper's cost), interleaved rounds",
    # bench all passes scaling's --models (and --quick) on; the rest at their defaults.
    main=main, add_arguments=add_arguments, options_in_all=False,
    title="The wrapper's tax: hvdtrain at one rank against plain Keras fit")


if __name__ == "__main__":
    common.rank_entry(sys.argv, plain_main, "hvdtrain.bench.tax")
