"""hvdtrain against Horovod's own TF2 synthetic benchmark, on the same work.

Horovod's ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py`` is not shipped with
hvdtrain (get it from Horovod's repository); pass its path with ``--horovod-synthetic PATH``.
Both train MobileNetV2 (224x224x3 inputs, 1000 classes, random weights) with batch 16 per rank
on one core per rank (``mpirun --bind-to core``), each with its own defaults otherwise: Horovod's
script as it is, hvdtrain with its launch defaults. Horovod's script reports rank 0's rate times
N; hvdtrain's figure is counted over all ranks (see scaling.py).
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from hvdtrain.bench import common, scaling

MODEL = scaling.Workload("mobilenetv2-224", "synthetic-mobilenetv2", 16, (224, 224, 3), 1000)
WORLD_SIZES = (1, 2)
FULL = scaling.Plan(world_sizes=WORLD_SIZES, warmup_epochs=1, repeats=4, steps_per_repeat=4)
QUICK = scaling.Plan(world_sizes=WORLD_SIZES, warmup_epochs=1, repeats=2, steps_per_repeat=2)

_ITER = re.compile(r"Iter #\d+: ([\d.]+) img/sec per")


def horovod_rates(output: str) -> list[float]:
    """Per-iteration img/s of rank 0 as Horovod's script prints them ('Iter #i: X img/sec')."""
    return [float(v) for v in _ITER.findall(output)]


def horovod_command(script: Path, ranks: int, plan: scaling.Plan) -> list[str]:
    """The mpirun command line of Horovod's own synthetic benchmark (``script``) at ``ranks``,
    with the model, batch and step counts of hvdtrain's side."""
    argv = [sys.executable, str(script), "--model", "MobileNetV2",
            "--batch-size", str(MODEL.batch_size), "--no-cuda",
            # The same steps as hvdtrain's run: warmup, then repeats of timed steps.
            "--num-warmup-batches", str(plan.steps_per_repeat + 1),
            "--num-batches-per-iter", str(plan.steps_per_repeat),
            "--num-iters", str(plan.repeats)]
    return common.launch_command("mpi", ranks, argv)


def run(script: Path | None, *, quick: bool) -> dict[str, Any]:
    if script is None or not Path(script).is_file():
        why = ("no --horovod-synthetic PATH given" if script is None
               else f"{script} does not exist")
        common.say(f"versus Horovod's synthetic benchmark: skipped ({why}; get "
                   f"examples/tensorflow2/tensorflow2_synthetic_benchmark.py from "
                   f"github.com/horovod/horovod)")
        return {"skipped": why}
    plan = QUICK if quick else FULL
    rows = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for ranks in plan.world_sizes:
            rows.append(_compare(script, ranks, plan, Path(tmp)))
    one = {r["ranks"]: r for r in rows}
    for r in rows:
        for system in ("horovod", "hvdtrain"):
            key = f"{system}_total_img_per_sec"
            r[f"{system}_efficiency"] = scaling.weak_scaling_efficiency(
                r[key]["median"], r["ranks"], one[1][key]["median"])
    return {"script": str(script), "model": "MobileNetV2 224x224x3, 1000 classes",
            "batch_size_per_rank": MODEL.batch_size, "launch": "mpirun --bind-to core",
            "plan": {"warmup_steps": plan.steps_per_repeat + 1, "repeats": plan.repeats,
                     "steps_per_repeat": plan.steps_per_repeat}, "results": rows}


def _compare(script: Path, ranks: int, plan: scaling.Plan, work_dir: Path) -> dict[str, Any]:
    """Horovod's script, then hvdtrain, on ``ranks`` ranks."""
    common.say(f"versus Horovod: Horovod's synthetic benchmark on {ranks} rank(s)...")
    output = common.run_job(horovod_command(script, ranks, plan),
                            what=f"Horovod's synthetic benchmark on {ranks} ranks")
    per_rank = horovod_rates(output)
    if not per_rank:
        raise common.BenchError(f"no 'Iter #' lines in the output of {script}:\n"
                                + "\n".join(output.splitlines()[-15:]))
    common.say(f"versus Horovod: hvdtrain on {ranks} rank(s)...")
    ours = scaling.measure(MODEL, ranks, plan, work_dir)
    theirs = common.summarize([ranks * r for r in per_rank])  # their method: rank 0 x N
    ratio = ours["total_samples_per_sec"]["median"] / theirs["median"]
    common.say(f"  Horovod {theirs['median']:.1f} img/s, hvdtrain "
               f"{ours['total_samples_per_sec']['median']:.1f} img/s: {ratio:.2f}x")
    return {"ranks": ranks, "horovod_total_img_per_sec": theirs,
            "hvdtrain_total_img_per_sec": ours["total_samples_per_sec"], "ratio": ratio,
            "hvdtrain_core_budget": ours["core_budget"]}
