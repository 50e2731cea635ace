"""hvdtrain against Horovod's own TF2 synthetic benchmark, on the same work.

Horovod's ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py`` is not shipped with
hvdtrain (get it from Horovod's repository); pass its path with ``--horovod-synthetic PATH``.
It cannot run on Keras 3 (``'Variable' object has no attribute 'ref'``): ``--horovod-venv
.venv-keras2`` runs it with that virtualenv's interpreter (TensorFlow 2.15, Keras 2) while
hvdtrain runs on this one's; the result records each side's versions.

Both train MobileNetV2 (224x224x3 inputs, 1000 classes, random weights) with batch 16 per rank
on one core per rank (``mpirun --bind-to core``) and one TensorFlow intra-op and inter-op thread
(hvdtrain's own choice on one core; Horovod's script through TF_NUM_INTRAOP_THREADS and
TF_NUM_INTEROP_THREADS), each with its own defaults otherwise. Horovod's script reports rank
0's rate times N; hvdtrain's figure is counted over all ranks (see trainer_job.py). Rounds
interleave the two (Horovod first, then hvdtrain first, ...) at each world size; the result is
the median over rounds of hvdtrain / Horovod, with its spread.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from hvdtrain.bench.shared import host, jobs, launch, report, stats, steps, targets, trainer_job
from hvdtrain.bench.shared.plans import Plan
from hvdtrain.bench.shared.workloads import Workload

MODEL = Workload("mobilenetv2-224", "synthetic-mobilenetv2", 16, (224, 224, 3), 1000)
WORLD_SIZES = (1, 2)
FULL = Plan(world_sizes=WORLD_SIZES, warmup_epochs=1, repeats=3, steps_per_repeat=4)
QUICK = Plan(world_sizes=WORLD_SIZES, warmup_epochs=1, repeats=2, steps_per_repeat=2)
ROUNDS, QUICK_ROUNDS = 3, 1
# One thread each, as hvdtrain's rank chooses on one core without buckets
# (placement.thread_counts).
THREAD_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
# The lines of Horovod's TF2 scripts that change to run on hvdtrain.horovod under Keras 3, each
# (old, new): the import, and Keras 3's Optimizer.variables, a property (Keras 2: a method).
# bench migration and scripts/horovod_examples.py both apply them.
TF_IMPORT = ("import horovod.tensorflow as hvd\n", "import hvdtrain.horovod.tensorflow as hvd\n")
OPT_VARIABLES = ("hvd.broadcast_variables(opt.variables(), root_rank=0)",
                 "hvd.broadcast_variables(opt.variables, root_rank=0)")

_ITER = re.compile(r"Iter #\d+: ([\d.]+) img/sec per")


def horovod_rates(output: str) -> list[float]:
    """Per-iteration img/s of rank 0 as Horovod's script prints them ('Iter #i: X img/sec')."""
    return [float(v) for v in _ITER.findall(output)]


def horovod_argv(script: Path, plan: Plan, python: str = sys.executable,
                 model: str = "MobileNetV2", batch_size: int = MODEL.batch_size) -> list[str]:
    """One rank's command line of Horovod's own synthetic benchmark (``script``), run by
    ``python`` (another venv's, where Horovod's Keras layer works), with ``model`` (a name of
    keras.applications; it trains at 224x224x3, 1000 classes), the batch and the step counts
    of hvdtrain's side."""
    return [python, str(script), "--model", model, "--batch-size", str(batch_size),
            "--no-cuda",
            # The same steps as hvdtrain's run: warmup, then repeats of timed steps.
            "--num-warmup-batches", str(plan.steps_per_repeat + 1),
            "--num-batches-per-iter", str(plan.steps_per_repeat),
            "--num-iters", str(plan.repeats)]


def horovod_command(script: Path, ranks: int, plan: Plan,
                    python: str = sys.executable) -> list[str]:
    """The mpirun command line of Horovod's own synthetic benchmark (``horovod_argv``) at
    ``ranks`` on this host."""
    return launch.launch_command("mpi", ranks, horovod_argv(script, plan, python))


def keras_major(versions: dict[str, str]) -> str:
    return versions.get("keras", "?").split(".", 1)[0]


def unavailable(script: Path | None, horovod_python: str) -> str | None:
    """Why Horovod's script (``script``, run by ``horovod_python``) cannot run, or None."""
    if script is None or not Path(script).is_file():
        why = ("no --horovod-synthetic PATH given" if script is None
               else f"{script} does not exist")
        return why + ("; get examples/tensorflow2/tensorflow2_synthetic_benchmark.py from "
                      "github.com/horovod/horovod")
    theirs = host.stack_versions(horovod_python)
    if keras_major(theirs) == "3":
        return (f"Horovod's script cannot run on Keras {theirs.get('keras')} ('Variable' "
                f"object has no attribute 'ref'): pass --horovod-venv .venv-keras2")
    return None


def run(script: Path | None, *, quick: bool, horovod_python: str = sys.executable,
        rounds: int | None = None) -> dict[str, Any]:
    theirs = host.stack_versions(horovod_python)
    why = unavailable(script, horovod_python)
    if why or script is None:
        report.say(f"versus Horovod's synthetic benchmark: skipped ({why})")
        return {"skipped": why}
    plan = QUICK if quick else FULL
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    measured: dict[int, list[dict[str, Any]]] = {n: [] for n in plan.world_sizes}
    loads = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for i in range(rounds):
            loads.append(host.load_average())
            for ranks in plan.world_sizes:
                order = ("horovod", "hvdtrain") if i % 2 == 0 else ("hvdtrain", "horovod")
                row: dict[str, Any] = {}
                for side in order:
                    report.say(f"versus Horovod: round {i + 1}/{rounds}, {side} on {ranks} "
                               f"rank(s)...")
                    if side == "horovod":
                        row["horovod"] = measure_horovod(script, ranks, plan, horovod_python)
                    else:
                        ours = trainer_job.measure(MODEL, ranks, plan, Path(tmp))
                        row["hvdtrain"] = ours["total_samples_per_sec"]["median"]
                        row["hvdtrain_core_budget"] = ours["core_budget"]
                row["ratio"] = row["hvdtrain"] / row["horovod"]
                report.say(f"  Horovod {row['horovod']:.1f} img/s, hvdtrain "
                           f"{row['hvdtrain']:.1f} img/s: {row['ratio']:.4f}x")
                measured[ranks].append(row)
    return {"script": str(script), "model": "MobileNetV2 224x224x3, 1000 classes",
            "batch_size_per_rank": MODEL.batch_size,
            "launch": "mpirun --bind-to core, one intra-op and one inter-op thread per rank",
            "versions": {"hvdtrain": host.stack_versions(), "horovod": theirs},
            "plan": {"rounds": rounds, "warmup_steps": plan.steps_per_repeat + 1,
                     "repeats": plan.repeats, "steps_per_repeat": plan.steps_per_repeat},
            "load_average_before_each_round": loads,
            "results": summarize_rounds(measured)}


def measure_horovod(script: Path, ranks: int, plan: Plan, python: str, *,
                    command: list[str] | None = None, env: dict[str, str] | None = None,
                    inter_op_threads: int = 1) -> float:
    """Horovod's script on ``ranks`` ranks: the median over its iterations of rank 0's img/s
    times N (its own method). ``command``: what starts it instead of ``horovod_command`` (bench
    network's across namespace hosts), with ``env``; ``inter_op_threads``: TensorFlow's, per
    rank."""
    threads = {**THREAD_ENV, "TF_NUM_INTEROP_THREADS": str(inter_op_threads)}
    output = jobs.run_job(command or horovod_command(script, ranks, plan, python),
                          env={**(env or {}), **threads},
                          what=f"Horovod's synthetic benchmark on {ranks} ranks")
    per_rank = horovod_rates(output)
    if not per_rank:
        raise jobs.BenchError(f"no 'Iter #' lines in the output of {script}:\n"
                                + "\n".join(output.splitlines()[-15:]))
    return stats.summarize([ranks * r for r in per_rank])["median"]


def summarize_rounds(measured: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per world size: each side's median over rounds, hvdtrain / Horovod per round (median,
    spread, noise) against its target, and each side's weak-scaling efficiency per round
    (against the same round's 1-rank figure)."""
    rows = []
    for ranks, rounds in measured.items():
        row: dict[str, Any] = {
            "ranks": ranks, "rounds": rounds,
            "horovod_total_img_per_sec": stats.summarize([r["horovod"] for r in rounds]),
            "hvdtrain_total_img_per_sec": stats.summarize([r["hvdtrain"] for r in rounds]),
            "ratio": stats.ratio_summary([r["ratio"] for r in rounds]),
            "target": targets.VERSUS_HOROVOD.get(ranks)}
        if 1 in measured and ranks != 1:
            for side in ("horovod", "hvdtrain"):
                row[f"{side}_efficiency"] = stats.ratio_summary([
                    steps.weak_scaling_efficiency(r[side], ranks, one[side])
                    for r, one in zip(rounds, measured[1])])
        rows.append(row)
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The comparison with Horovod's TF2 synthetic benchmark (``run``), for bench scaling."""
    if "skipped" in result:
        return f"Versus Horovod's TF2 synthetic benchmark: skipped ({result['skipped']})."
    rows = []
    for r in result["results"]:
        efficiency = {side: stats.ratio_text(r[f"{side}_efficiency"])
                      if f"{side}_efficiency" in r else "" for side in ("horovod", "hvdtrain")}
        rows.append([r["ranks"], f"{r['horovod_total_img_per_sec']['median']:,.2f}",
                     efficiency["horovod"], f"{r['hvdtrain_total_img_per_sec']['median']:,.2f}",
                     efficiency["hvdtrain"], stats.ratio_cell(r["ratio"], r["target"])])
    versions = result["versions"]
    loads = ", ".join(f"{x:.2f}" for x in result["load_average_before_each_round"])
    return "\n".join([
        f"Versus Horovod's TF2 synthetic benchmark ({result['model']}, batch "
        f"{result['batch_size_per_rank']} per rank, {result['launch']}, each with its own "
        f"defaults; hvdtrain on {host.stack_line(versions['hvdtrain'])}, Horovod's script on "
        f"{host.stack_line(versions['horovod'])}; {result['plan']['rounds']} interleaved "
        f"rounds, each side's figure the median of {result['plan']['repeats']} repeats, then "
        f"the median over rounds; efficiencies and ratios per round, median (spread); load "
        f"before each round: {loads}):", "",
        report.markdown_table(["ranks", "Horovod img/s", "Horovod efficiency",
                               "hvdtrain img/s", "hvdtrain efficiency", "hvdtrain / Horovod"],
                              rows)])
