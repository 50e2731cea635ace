"""Plain Keras ``fit`` of a training job's work, with no Horovod at all, on one core: what a
user's own single-device script does (bench tax's plain side, bench scaling's plain row, and
the job bench ops profiles).

The same model, optimizer, batch, thread counts and synthetic data as hvdtrain's job (built by
hvdtrain's model and data code, so that the work is the same), then ``model.fit(x, y)``; one
process pinned to the core that ``mpirun --bind-to core`` gives rank 0, timed by the same step
timer as hvdtrain's ranks.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from hvdtrain.bench.shared import jobs, launch, stats, steps
from hvdtrain.bench.shared.plans import Plan, job_options
from hvdtrain.bench.shared.workloads import Workload

MODULE = "hvdtrain.bench.shared.plain_job"


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
    """One job's work (``job_options`` at one rank) as a user's single-device script
    sets it up, with no Horovod: pinned to the core ``mpirun --bind-to core`` gives rank 0,
    the threads, the seed, the data and the compiled model. TensorFlow imports here."""
    core = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {core})   # the core mpirun --bind-to core gives rank 0
    import tensorflow as tf
    from hvdtrain.launch import placement
    from hvdtrain.config import presets

    cfg = presets.build_config(options["preset"], assignments=options["assignments"])
    share = placement.threads_per_rank(*placement.cores_available(), 1)
    intra, inter = placement.thread_counts(share, cfg.run.intra_op_threads,
                                           cfg.run.inter_op_threads)
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    model, x, y = compiled_work(cfg)
    return PlainJob(model, x, y, cfg.train.batch_size, cfg.train.epochs, core, intra, inter)


def compiled_work(cfg: Any) -> tuple[Any, Any, Any]:
    """``cfg``'s model, compiled with its plain optimizer (no Horovod), and its synthetic
    training arrays (x, y), seeded as hvdtrain seeds a run: what ``fit`` trains on one device
    (bench cluster's ranks alone too). TensorFlow's threads must be set before."""
    import tensorflow as tf
    from hvdtrain.models import registry
    from hvdtrain.data import sources

    tf.keras.utils.set_random_seed(cfg.train.seed)
    dataset = sources.load(cfg.data, cfg.train.seed)
    assert isinstance(dataset.train, sources.Arrays)  # the benchmark's presets are synthetic
    model = registry.build(cfg.model, dataset.input_shape, dataset.num_classes)
    registry.compile_classifier(model, registry.base_optimizer(cfg.optim))
    return model, dataset.train.x, dataset.train.y


def plain_main(options: dict[str, Any]) -> None:
    """Plain Keras ``fit`` of one job's work (``job_options`` at one rank), timed; its
    figures written to ``options['out']`` as scaling's rank 0 writes them."""
    job = plain_job(options)
    timer = steps.step_timer()
    job.fit([timer])
    figures = {"rank": 0, "params": int(job.model.count_params()), "cores": [job.core],
               "intra_op_threads": job.intra_op_threads,
               "inter_op_threads": job.inter_op_threads,
               **steps.timed_repeats(timer.epochs, options["warmup_epochs"], job.batch_size),
               **steps.step_breakdown(timer.starts, timer.epochs, options["warmup_epochs"])}
    Path(options["out"]).write_text(json.dumps({"ranks": [figures]}))


def measure_plain(workload: Workload, plan: Plan, work_dir: Path,
                  python: str = sys.executable,
                  assignments: Sequence[str] = ()) -> tuple[float, dict[str, Any]]:
    """Plain ``fit``'s median samples/s over the plan's timed repeats, and its raw figures
    (the model's parameter count, the step breakdown); ``assignments``: config settings on top
    of the workload's."""
    options = job_options(workload, 1, plan, work_dir)
    options["assignments"] += list(assignments)
    command = launch.rank_argv(MODULE, options, python)
    output = jobs.run_job(command, what=f"plain fit of {workload.name}")
    raw = jobs.read_json_output(Path(options["out"]), f"plain fit of {workload.name}",
                                  output)
    return stats.summarize(steps.repeat_rates(raw["ranks"]))["median"], raw["ranks"][0]


if __name__ == "__main__":
    launch.rank_entry(sys.argv, plain_main, MODULE)
