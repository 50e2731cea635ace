"""What rank 0 tells the user about a run: the banner before training and summary.json after.
Pure: both are built from plain values, so they are testable without Horovod."""
from __future__ import annotations

import dataclasses
from typing import Any

from hvdtrain.training import schedules
from hvdtrain.config import Config

# The gradient options the banner names when they differ from the defaults.
BANNER_OPTIONS = ("compression", "backward_passes_per_step", "op", "sparse_as_dense",
                  "join_uneven")


def changed_gradient_options(config: Config) -> list[str]:
    """The banner's gradient options that differ from their defaults, as NAME=VALUE."""
    default = type(config.horovod)()
    return [f"{name}={getattr(config.horovod, name)}" for name in BANNER_OPTIONS
            if getattr(config.horovod, name) != getattr(default, name)]


def buckets_note(world: Any, buckets_mb: float) -> str | None:
    """The banner's note on buckets in force (``buckets_mb``), or None: where they cannot
    overlap backprop, under mpirun on a rank of one CPU thread. Open MPI moves a collective's
    data only while Horovod's thread polls for it, and while backprop runs that thread gets
    slivers of the core, so the buckets go after backprop (benchmarks/results/network-thread-cpu);
    Gloo waits in the kernel."""
    if world.size < 2 or not buckets_mb:
        return None
    if not (world.controller == "mpi" and world.device.startswith("/CPU")
            and world.intra_op_threads == 1):
        return None
    return ("buckets under mpirun with one core per rank wait for backprop to end (Open MPI "
            "moves data only while Horovod's thread polls); horovodrun --gloo overlaps them: "
            "docs/horovod-options.md, bucket_mb")


def buckets_description(config: Config, world: Any, buckets_mb: float) -> str:
    """The banner's words for the buckets in force: ", buckets 2 MB" (with why, "(auto: ranks
    on several hosts)" or "(auto: elastic training)", where auto chose them), or nothing for one
    all-reduce per step."""
    if not buckets_mb:
        return ""
    why = "ranks on several hosts" if world.local_size < world.size else "elastic training"
    return f", buckets {buckets_mb:g} MB" + (f" (auto: {why})"
                                              if config.horovod.bucket_mb == -1 else "")


def banner(config: Config, world: Any, *, data: str, params: int, steps: int, peak_lr: float,
           start_epoch: int, horovod_in_force: str, buckets_mb: float, run_dir: str,
           hvdtrain: str) -> str:
    """Rank 0's banner at the start of training: hvdtrain's version (version.describe()),
    world, data, model, optimizer and LR, batch and epochs, loop and precision, Horovod's
    settings, the stack and the run directory."""
    c, w = config, world
    options = "".join(f", {option}" for option in changed_gradient_options(c))
    reduction = buckets_description(c, w, buckets_mb) + ("" if c.horovod.flatten
                                                      else ", grouped all-reduce")
    note = buckets_note(w, buckets_mb)
    note_line = f"  note  {note}\n" if note else ""
    return (
        f"hvdtrain {hvdtrain}: {w.size} rank{'s' if w.size > 1 else ''} ({w.controller}), "
        f"{w.device} x {w.intra_op_threads} threads per rank\n"
        f"  data  {data}\n"
        f"  model {c.model.name}, {params:,} parameters"
        f"{', synchronized batch norm' if c.model.sync_batch_norm else ''}\n"
        f"  optim {c.optim.name}, lr {c.optim.lr:g} per rank -> {peak_lr:g} "
        f"({schedules.scaling_in_force(c.optim.lr_scaling, c.horovod.op)} scaling, "
        f"{c.optim.warmup_epochs:g} warmup epochs, "
        f"{c.optim.decay})\n"
        f"  batch {c.train.batch_size} per rank, {c.train.batch_size * w.size} global, "
        f"{steps} steps per epoch, epochs {start_epoch + 1}..{c.train.epochs}\n"
        f"  loop  {c.train.loop}, {c.train.precision}{options}\n"
        f"  horovod {horovod_in_force}{reduction}\n"
        f"{note_line}"
        f"  stack {w.stack}\n"
        f"  run   {run_dir}")


def summary(config: Config, world: Any, *, resumed_from_epoch: int | None, steps: int,
            peak_lr: float, params: int, data: str, final_logs: dict, final_eval: dict,
            train_seconds: float, samples_trained: int, wall_seconds: float,
            buckets_mb: float, run_dir: str, hvdtrain: str) -> dict[str, Any]:
    """What rank 0 writes to RUN_DIR/summary.json (``hvdtrain``: version.describe())."""
    c = config
    return {
        "hvdtrain_version": hvdtrain,
        "preset": c.preset,
        "world_size": world.size,
        "controller": world.controller,
        "device": world.device,
        "stack": world.stack,
        "intra_op_threads": world.intra_op_threads,
        "epochs": c.train.epochs,
        "resumed_from_epoch": resumed_from_epoch,
        "batch_size_per_rank": c.train.batch_size,
        "global_batch_size": c.train.batch_size * world.size,
        "steps_per_epoch": steps,
        "peak_lr": peak_lr,
        "model": c.model.name,
        "loop": c.train.loop,
        "precision": c.train.precision,
        "horovod": dataclasses.asdict(c.horovod),
        "bucket_mb_in_force": buckets_mb,
        "params": params,
        "data": data,
        "final_train_loss": final_logs.get("loss"),
        "final_train_accuracy": final_logs.get("accuracy"),
        "final_eval_loss": final_eval["eval_loss"],
        "final_eval_accuracy": final_eval["eval_accuracy"],
        "eval_samples": final_eval["eval_samples"],
        "train_seconds": train_seconds,
        "train_samples_per_sec": samples_trained / train_seconds if train_seconds else None,
        "wall_seconds": wall_seconds,
        "run_dir": run_dir,
    }
