"""How a training benchmark times its jobs: the plan (world sizes, warmup, repeats, steps, the
launcher), and the settings every process of one measured job reads."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdtrain.launch import launchers
from hvdtrain.errors import UserError
from hvdtrain.bench.shared.workloads import Workload


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


def synthetic_sizes(ranks: int, batch_size: int, steps_per_epoch: int) -> tuple[int, float]:
    """(data.num_samples, data.eval_fraction) that give each of ``ranks`` ranks exactly
    ``steps_per_epoch`` full batches, with one batch per rank held out for eval."""
    train = ranks * batch_size * steps_per_epoch
    held_out = ranks * batch_size
    return train + held_out, held_out / (train + held_out)


def job_options(workload: Workload, ranks: int, plan: Plan, work_dir: Path) -> dict[str, Any]:
    """What every process of one measured job of ``ranks`` ranks reads: the preset and its
    settings (each rank ``plan.steps_per_repeat`` + 1 full batches an epoch), the warmup, and
    the file rank 0 writes the figures to."""
    run_dir = work_dir / f"{workload.name}-{ranks}-{time.monotonic_ns()}"
    return {"preset": workload.preset, "assignments": job_assignments(workload, ranks, plan,
                                                                      run_dir),
            "out": str(run_dir.with_suffix(".json")), "warmup_epochs": plan.warmup_epochs,
            "launcher": plan.launcher}


def job_assignments(workload: Workload, ranks: int, plan: Plan, run_dir: Path) -> list[str]:
    """The config settings of one measured job of ``ranks`` ranks on top of the workload's
    preset: its batch and input, each rank ``plan.steps_per_repeat`` + 1 full batches an
    epoch, no eval, export, TensorBoard or progress line, and ``run_dir``."""
    num_samples, eval_fraction = synthetic_sizes(ranks, workload.batch_size,
                                                 plan.steps_per_repeat + 1)
    return [f"train.batch_size={workload.batch_size}", f"train.epochs={plan.epochs}",
            "train.eval_every=0", f"data.num_samples={num_samples}",
            f"data.eval_fraction={eval_fraction!r}",
            "data.image_shape=" + ",".join(map(str, workload.image_shape)),
            f"data.num_classes={workload.num_classes}",
            "run.export=false", "run.tensorboard=false", "run.progress_every_s=0",
            f"run.run_dir={run_dir}"]


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
