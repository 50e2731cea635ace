"""``hvdtrain bench cluster``: the scaling benchmark of the user's own cluster and model, run
inside the ranks their launcher starts (``mpirun -np 16 -H ...``, ``horovodrun``, ``srun``),
as Horovod's users run its synthetic benchmark. It starts no ranks itself.

Every rank first trains alone (a plain optimizer, no all-reduce: all ranks at once, see
shared/cluster_figures.py for why), then the same model in hvdtrain's Trainer over the whole
job, on synthetic data of the given shape, each timed by the step timer; rank 0 gathers every
rank's figures. Rank 0's Horovod timeline (HOROVOD_TIMELINE, which Horovod reads in
``hvd.init()``: set through ``dist.init``'s options, as ``--set horovod.timeline`` does for
train) gives the gradients' all-reduce by phase; the cost model of bench project, fitted to
those phases, projects the efficiency to larger worlds. Rank 0 alone prints and writes
cluster.json and cluster.md. The timeline's writing slows the job a little.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import socket
import statistics
from pathlib import Path
from typing import Any

from hvdtrain.launch import placement
from hvdtrain.errors import UserError
from hvdtrain.bench import registry
from hvdtrain.bench.shared import (cluster_figures, host, jobs, paper, plain_job, plans, report,
                                   steps, timeline)
from hvdtrain.bench.shared.workloads import Workload

NAME = "cluster"
BASE_PRESET = "synthetic-mlp"     # a synthetic-data preset; the model and input replace its own


def job_config(args: argparse.Namespace, ranks: int, plan: plans.Plan, run_dir: Path) -> Any:
    """The Trainer's config for a job of ``ranks`` ranks: ``args``' model, input and batch on
    synthetic data, each rank ``plan.steps_per_repeat`` + 1 batches an epoch, and one
    all-reduce a step after backprop (not the buckets auto gives across hosts): the cost model
    fitted to the timeline and its projection are of one fused all-reduce."""
    from hvdtrain.config import presets
    work = Workload(args.model, BASE_PRESET, args.batch_size,
                    cluster_figures.input_shape(args.input_shape), args.classes)
    return presets.build_config(BASE_PRESET, assignments=[
        f"model.name={args.model}", "horovod.bucket_mb=0",
        *plans.job_assignments(work, ranks, plan, run_dir)])


def alone(cfg: Any, plan: plans.Plan) -> tuple[dict[str, list[float]], int]:
    """This rank alone: ``cfg``'s model with a plain optimizer, ``plain_job``'s ``fit`` on
    one rank's share of batches, timed; its repeats and its gradients' bytes."""
    import tensorflow as tf
    model, x, y = plain_job.compiled_work(cfg)
    take = (plan.steps_per_repeat + 1) * cfg.train.batch_size
    timer = steps.step_timer()
    model.fit(x[:take], y[:take], batch_size=cfg.train.batch_size, epochs=plan.epochs,
              shuffle=False, verbose=0, callbacks=[timer])
    nbytes = sum(int(tf.size(w)) * tf.as_dtype(w.dtype).size for w in model.trainable_weights)
    return steps.timed_repeats(timer.epochs, plan.warmup_epochs, cfg.train.batch_size), nbytes


def rank_main(args: argparse.Namespace, plan: plans.Plan, out: Path) -> None:
    """One rank: alone, then in the job; rank 0 writes what every rank timed."""
    from hvdtrain.training import trainer
    from hvdtrain import distributed as dist
    from hvdtrain.training import rank_job

    run_dir, trace = out / "cluster-run", out / "cluster.timeline.json"
    start_cfg = job_config(args, placement.launcher_size(), plan, run_dir)
    # Horovod: its coordinator (rank 0) writes the timeline this option names; Horovod reads
    # HOROVOD_TIMELINE once, in hvd.init(), which dist.init calls after setting it.
    world = rank_job.start(start_cfg, options=dataclasses.replace(start_cfg.horovod,
                                                               timeline=str(trace)))
    cfg = job_config(args, world.size, plan, run_dir)
    with rank_job.same_on_every_rank():
        repeats, nbytes = alone(cfg, plan)
    timer = steps.step_timer()
    rank_job.run(world, lambda: trainer.Trainer(cfg, world, extra_callbacks=[timer]).train())
    mine = {"rank": world.rank, "host": socket.gethostname(), "alone": repeats,
            "job": steps.timed_repeats(timer.epochs, plan.warmup_epochs, cfg.train.batch_size),
            "gradient_bytes": nbytes}
    everyone = dist.allgather_object(mine)  # Horovod: every rank's own figures, in rank order
    if world.is_chief:
        shutil.rmtree(run_dir, ignore_errors=True)   # the Trainer's checkpoints: not results
        result = assemble(args, plan, everyone, world, trace)
        report.write_outputs(out, NAME, result, cluster_figures.markdown(result))
        report.say(cluster_figures.markdown(result))


def assemble(args: argparse.Namespace, plan: plans.Plan, everyone: list[dict[str, Any]],
             world: Any, trace: Path) -> dict[str, Any]:
    """cluster.json's content: the job, the rates, the phases and the projection."""
    rates = cluster_figures.throughput(everyone)
    nbytes = everyone[0]["gradient_bytes"]
    compute_s = args.batch_size / statistics.median(r["alone_samples_per_sec"]
                                                    for r in rates["ranks"])
    result: dict[str, Any] = {
        "benchmark": NAME, "machine": host.machine(), "model": args.model,
        "input_shape": list(cluster_figures.input_shape(args.input_shape)),
        "batch_size_per_rank": args.batch_size, "world_size": world.size,
        "controller": world.controller, "stack": world.stack,
        "plan": dataclasses.asdict(plan), "gradient_bytes": nbytes, "compute_s": compute_s,
        "throughput": rates, "raw": everyone, "phases": None}
    if world.size == 1:
        result["projection_missing"] = ("one rank reduces nothing: launch 2 or more for the "
                                        "all-reduce's phases and the projection")
        return result
    try:
        steps_per_epoch = plan.steps_per_repeat + 1
        result["phases"] = timeline.step_phases(
            timeline.tensor_phases(timeline.read_timeline(trace.read_text())),
            skip=plan.warmup_epochs * steps_per_epoch)
        link = cluster_figures.fitted_link(result["phases"]["phases_ms"], world.size, nbytes,
                                           args.latency_us * 1e-6)
    except (OSError, ValueError, jobs.BenchError) as e:
        result["projection_missing"] = str(e)
        return result
    result["link"] = link.as_dict()
    result["projection"] = cluster_figures.projection(
        compute_s, nbytes, link, sorted({world.size, *args.project_to}))
    return result


# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench cluster (under the user's launcher)

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mobilenetv2",
                        help="a registered model (hvdtrain train --model's) or your own "
                             "package.module:function, importable on every host (default "
                             "mobilenetv2)")
    parser.add_argument("--input-shape", default="64,64,3",
                        help="the synthetic input's shape (default 64,64,3)")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    parser.add_argument("--classes", type=int, default=10, help="outputs (default 10)")
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps per repeat (default 10)")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs (default 3)")
    parser.add_argument("--latency-us", type=float, default=paper.CLUSTER_LATENCY_US,
                        help=f"your network's hop latency for the projection (default "
                             f"{paper.CLUSTER_LATENCY_US:g})")
    parser.add_argument("--project-to", type=plans.world_sizes,
                        default=cluster_figures.PROJECTED_RANKS,
                        help="world sizes to project to (default 8,64,512)")


def main(args: argparse.Namespace) -> None:
    if not cluster_figures.inside_a_job(os.environ):
        raise UserError("bench cluster runs inside the ranks your launcher starts, e.g. "
                        "mpirun -np 4 -H a:2,b:2 hvdtrain bench cluster --model ...; no "
                        "launcher's rank variable is set here")
    from hvdtrain.launch import rank_process
    rank_process.load_tensorflow()         # quiet, as train's ranks load it
    from hvdtrain.models import registry
    from hvdtrain.training import rank_job
    with rank_job.same_on_every_rank():    # the same argv on every rank: rank 0 alone says it
        cluster_figures.input_shape(args.input_shape)
        if min(args.batch_size, args.classes, args.steps, args.repeats) < 1:
            raise UserError("--batch-size, --classes, --steps and --repeats must be >= 1")
        registry.resolve(args.model)   # before Horovod starts: every rank stops alike, at once
    plan = plans.Plan(world_sizes=(placement.launcher_size(),), warmup_epochs=1,
                      repeats=args.repeats, steps_per_repeat=args.steps)
    out = Path(args.out)
    if placement.launcher_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "cluster.timeline.json").unlink(missing_ok=True)
        shutil.rmtree(out / "cluster-run", ignore_errors=True)
    rank_main(args, plan, out)


BENCHMARK = registry.Benchmark(
    name=NAME, help="your cluster and model: run under your launcher (mpirun, horovodrun, "
                    "srun); throughput, efficiency against the ranks alone, the all-reduce's "
                    "phases, the projection",
    main=main, add_arguments=add_arguments, quick=False)
