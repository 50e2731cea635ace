"""One measured job of hvdtrain's real Trainer on N ranks (bench scaling's, and the hvdtrain
side of tax, stacks, phases and the comparison with Horovod's script).

Each world size N is its own launch (``mpirun -np N --bind-to core`` by default: one core per
rank at every N, so that N=1 and N=2 are comparable). Every rank trains through hvdtrain's real
``Trainer`` on synthetic data, with hvdtrain's default launch settings, and times its own
steps. An epoch is one timed repeat: its first step (after the previous epoch's checkpoint and
metric averaging) starts the clock, its last step stops it, and the first epochs are warmup
(tracing, memory growth). Each rank counts its own samples; rank 0 gathers every rank's counts
and times, so the total rate is (sum of samples over ranks) / (slowest rank's time) for each
repeat, never rank 0's rate times N.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hvdtrain.launch import launchers
from hvdtrain.bench.shared import check_cost, jobs, launch, stats, steps
from hvdtrain.bench.shared.plans import Plan, job_options
from hvdtrain.bench.shared.workloads import Workload

MODULE = "hvdtrain.bench.shared.trainer_job"
# A rank's command line -> the command that starts the job's ranks (netns_launch.across_hosts).
LaunchWith = Callable[[Sequence[str]], list[str]]


def rank_main(options: dict[str, Any]) -> None:
    """One rank of one launch: train ``options['epochs']`` epochs, time each, and have rank 0
    write every rank's figures to ``options['out']``."""
    pinned = (None if launchers.entry(options["launcher"]).binds_cores
              else launch.pin_to_own_core())
    import os
    from hvdtrain.training import trainer
    from hvdtrain.config import presets
    from hvdtrain import distributed as dist  # TensorFlow and Horovod load here

    cfg = presets.build_config(options["preset"], assignments=options["assignments"])
    world = dist.init(device="cpu", intra_op_threads=cfg.run.intra_op_threads,
                      inter_op_threads=cfg.run.inter_op_threads, options=cfg.horovod)
    timer = steps.step_timer(steps.slow_rank_delay(os.environ.get(steps.SLOW_RANK_ENV, ""),
                                                world.rank))
    job = trainer.Trainer(cfg, world, extra_callbacks=[timer])
    summary = job.train()
    # The consistency check's cost, where asked (the training rounds bench tax reads) and
    # where the check acts: at 2 ranks or more.
    timed = steps.timed_repeats(timer.epochs, options["warmup_epochs"], cfg.train.batch_size)
    check = ({**check_cost.epoch_seconds(job.model, statistics.median(timed["seconds"])),
              "record_seconds_per_batch": check_cost.record_seconds_per_batch(
                  (cfg.train.batch_size, *cfg.data.image_shape))}
             if options.get("check_cost") and world.size > 1 else {})

    mine = {"rank": world.rank, "params": summary["params"],
            **timed,
            **steps.step_breakdown(timer.starts, timer.epochs, options["warmup_epochs"]),
            **check,
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


def measure(workload: Workload, ranks: int, plan: Plan, work_dir: Path,
            python: str = sys.executable, core: int | None = None, *,
            settings: Sequence[str] = (), launch_with: LaunchWith | None = None,
            env: Mapping[str, str] | None = None, what: str | None = None,
            check_cost: bool = False) -> dict[str, Any]:
    """One launch of ``ranks`` ranks on ``workload``: the per-rank figures and the totals.
    ``python``: the interpreter (and so the stack) the ranks run on; ``core``: a 1-rank job's
    core (``launch.launch_command``); ``settings``: config settings over the workload's (say
    horovod.bucket_mb=2); ``launch_with``: what starts the ranks instead of the plan's
    launcher on this host (bench network's across namespace hosts), with ``env``; ``what``:
    the job's name in a failure's message; ``check_cost``: each rank also times the
    consistency check after training (shared/check_cost.py; bench tax)."""
    options = job_options(workload, ranks, plan, work_dir)
    options["assignments"] += list(settings)
    options["check_cost"] = check_cost
    raw = run(options, ranks, python, what=what or f"scaling {workload.name} on {ranks} ranks",
              core=core, launch_with=launch_with, env=env)
    rates = steps.repeat_rates(raw["ranks"])
    per_rank = [r["samples"][i] / r["seconds"][i] for r in raw["ranks"]
                for i in range(len(r["seconds"]))]
    return {"model": workload.name, "ranks": ranks, "controller": raw["controller"],
            "stack": raw["stack"],
            "launcher": plan.launcher, "batch_size_per_rank": workload.batch_size,
            "image_shape": list(workload.image_shape),
            "total_samples_per_sec": stats.summarize(rates),
            "per_rank_samples_per_sec": stats.summarize(per_rank),
            "core_budget": [{"rank": r["rank"], "cores": r["cores"],
                             "intra_op_threads": r["intra_op_threads"],
                             "inter_op_threads": r["inter_op_threads"]}
                            for r in raw["ranks"]],
            "rank_env": raw["ranks"][0]["env"], "raw": raw["ranks"]}


def run(options: dict[str, Any], ranks: int, python: str, *, what: str,
        env: Mapping[str, str] | None = None, core: int | None = None,
        launch_with: LaunchWith | None = None) -> dict[str, Any]:
    """Launches the job ``options`` describes (``job_options``) on ``ranks`` ranks under its
    launcher (a 1-rank job on ``core``, if given; ``launch_with``'s command instead, if
    given), run by ``python``: what its rank 0 wrote."""
    argv = launch.rank_argv(MODULE, options, python)
    command = (launch_with(argv) if launch_with else
               launch.launch_command(options["launcher"], ranks, argv, core))
    output = jobs.run_job(command, what=what, env=env)
    return jobs.read_json_output(Path(options["out"]), what, output)


if __name__ == "__main__":
    launch.rank_entry(sys.argv, rank_main, MODULE)
