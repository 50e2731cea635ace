"""What one rank's input pipeline delivers, next to the rate its training step consumes.

For each bundled model at its preset's input and per-rank batch (``digits``: cnn, and
``digits-mlp``: mlp, at 8x8x1 and 32; ``synthetic-resnet``: resnet_small at 32x32x3 and 64;
``synthetic-mobilenetv2``: mobilenetv2 at 64x64x3 and 16), and each source that holds that
input: ``digits`` (8x8x1 only), ``synthetic``, ``npz``, ``tfrecord`` (that .npz through
``hvdtrain data convert``, 4 shards, kept in memory as the default ``data.cache=auto`` does),
``tfrecord-streamed`` (the same shards read every epoch: ``data.cache=off``, as for a share
over 1 GiB) and ``images`` (one folder of PNG and JPEG files per class, the JPEGs at twice the
size, as ``digit_files`` writes them). The files hold scikit-learn's digits, each pixel
repeated up to the input's size, grey repeated to its channels.

Two rates in samples/s, measured one after the other in one process bound to ``threads`` cores
with as many TensorFlow intra-op threads (default 1: the one-core-per-rank budget of ``bench
scaling``, and a rank's share when a host runs a rank per core):

- pipeline: hvdtrain's own training pipeline for the source (``sources.train_dataset`` of rank 0
  of 1, with the config's defaults) iterated alone, after its first batches (tracing);
- step: the model's training step (Keras ``fit``, the preset's optimizer) on one batch held in
  memory, without the all-reduce, which only makes a step slower: the harder case.

Goal (issue 14): pipeline >= 2 x step for every model and source. Each rate is the median of
``repeats`` timed repeats of ``seconds`` each.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hvdtrain.errors import UserError
from hvdtrain.bench import registry
from hvdtrain.bench.shared import host, jobs, launch, plots, report, stats, steps, targets

GOAL = targets.INPUT_OVER_STEP
SOURCES = ("digits", "synthetic", "npz", "tfrecord", "tfrecord-streamed", "images")
SEED = 42
WARMUP_BATCHES = 5
EPOCHS = 20         # of the pipeline, as one training run of 20 epochs would read them
CALIBRATION_STEPS = 6
MODULE = "hvdtrain.bench.input"


@dataclass(frozen=True)
class Plan:
    presets: tuple[str, ...]
    samples: int          # digits written to the files (of 1,797)
    seconds: float        # per timed repeat
    repeats: int


FULL = Plan(("digits", "digits-mlp", "synthetic-resnet", "synthetic-mobilenetv2"), 1797, 1.0, 3)
QUICK = Plan(("digits-mlp",), 600, 0.2, 2)


# ---------------------------------------------------------------------------------------------
# Pure: the comparison (tested without TensorFlow)

def compare(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model and source at the model's input and batch: both rates, their ratio,
    and whether the pipeline is at least GOAL times the step."""
    rows = []
    for step in raw["steps"]:
        step_rate = stats.summarize(step["rates"])
        for pipe in raw["pipelines"]:
            if pipe["shape"] != step["shape"] or pipe["batch_size"] != step["batch_size"]:
                continue
            pipe_rate = stats.summarize(pipe["rates"])
            ratio = pipe_rate["median"] / step_rate["median"]
            rows.append({"model": step["model"], "preset": step["preset"],
                         "shape": step["shape"], "batch_size": step["batch_size"],
                         "source": pipe["source"], "pipeline_samples_per_sec": pipe_rate,
                         "step_samples_per_sec": step_rate, "ratio": ratio,
                         "meets_goal": ratio >= GOAL})
    return rows


# ---------------------------------------------------------------------------------------------
# Rank side: one process, TensorFlow loaded after the cores are chosen

def _bind(threads: int) -> list[int]:
    """This process on ``threads`` cores with as many intra-op threads, as dist.init sets a
    rank (inter-op: min(2, threads))."""
    cores = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, set(cores))
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    return cores


def _sources(shape: tuple[int, ...], samples: int, work: Path) -> dict[str, Any]:
    """The data config of every source that holds ``shape``, its files written under ``work``."""
    import numpy as np
    from hvdtrain.data import convert, sources
    from hvdtrain.testing import digit_files
    from hvdtrain.config import DataConfig

    folder = work / "x".join(map(str, shape))
    folder.mkdir(parents=True)
    side, _, channels = shape
    x, y = digit_files.digits_uint8(side, channels)
    np.savez(folder / "digits.npz", x=x[:samples], y=y[:samples])
    convert.convert(str(folder / "digits.npz"), str(folder / "shards"), shards=4, seed=SEED,
                    progress=lambda total: convert.Progress(total, stream=io.StringIO()))
    digit_files.write_digits(folder / "images", range(samples), side=side, channels=channels)
    configs = {"digits": DataConfig(source="digits")} if shape == sources.DIGITS_SHAPE else {}
    configs.update(
        synthetic=DataConfig(source="synthetic", num_samples=samples, image_shape=shape),
        npz=DataConfig(source="npz", path=str(folder / "digits.npz"), num_classes=0),
        tfrecord=DataConfig(source="tfrecord", path=str(folder / "shards")),
        **{"tfrecord-streamed": DataConfig(source="tfrecord", path=str(folder / "shards"),
                                           cache="off")},
        images=DataConfig(source="images", path=str(folder / "images"), image_shape=shape))
    return configs


def _timed(next_batch, plan: Plan) -> list[float]:
    """samples/s of ``next_batch()`` (returning a batch's size), per timed repeat."""
    rates = []
    for _ in range(plan.repeats):
        samples, start = 0, time.perf_counter()
        while time.perf_counter() - start < plan.seconds:
            samples += next_batch()
        rates.append(samples / (time.perf_counter() - start))
    return rates


def pipeline_rates(cfg, batch_size: int, plan: Plan) -> list[float]:
    """hvdtrain's training pipeline of ``cfg``'s source for rank 0 of 1, iterated alone."""
    from hvdtrain.data import sources
    stream = sources.train_dataset(sources.load(cfg, SEED).train, rank=0, size=1,
                                batch_size=batch_size, first_epoch=0, epochs=EPOCHS,
                                seed=SEED, shuffle=cfg.shuffle,
                                shuffle_buffer=cfg.shuffle_buffer)
    batches = iter(stream.dataset.repeat())   # rarely restarts: a restart is not training
    for _ in range(WARMUP_BATCHES):
        next(batches)
    return _timed(lambda: int(next(batches)[1].shape[0]), plan)


def step_rates(preset: str, plan: Plan) -> tuple[dict[str, Any], list[float]]:
    """The preset's model and optimizer, training on one batch held in memory."""
    import numpy as np
    import tensorflow as tf
    from hvdtrain.models import registry
    from hvdtrain.config import presets
    from hvdtrain.data import sources

    cfg = presets.build_config(preset)
    shape, batch = sources.input_shape(cfg.data), cfg.train.batch_size
    tf.keras.utils.set_random_seed(SEED)
    model = registry.build(cfg.model, shape, 10)
    registry.compile_classifier(model, registry.base_optimizer(cfg.optim))
    rng = np.random.default_rng(SEED)
    one = tf.data.Dataset.from_tensors((rng.random((batch, *shape), np.float32),
                                        rng.integers(0, 10, batch).astype(np.int32))).repeat()
    timer = steps.step_timer()
    model.fit(one, steps_per_epoch=CALIBRATION_STEPS, verbose=0, callbacks=[timer])  # traces
    per_step = (timer.epochs[0][-1] - timer.epochs[0][0]) / (CALIBRATION_STEPS - 1)
    per_repeat = int(min(max(plan.seconds / per_step, 5), 5000))
    timer.epochs.clear()
    model.fit(one, steps_per_epoch=per_repeat + 1, epochs=plan.repeats, verbose=0,
              callbacks=[timer])
    rates = [(len(t) - 1) * batch / (t[-1] - t[0]) for t in timer.epochs]
    return {"preset": preset, "model": cfg.model.name, "shape": list(shape),
            "batch_size": batch, "steps_per_repeat": per_repeat}, rates


def rank_main(options: dict[str, Any]) -> None:
    cores = _bind(options["threads"])
    from hvdtrain.config import presets
    from hvdtrain.data import sources
    plan = Plan(**{**options["plan"], "presets": tuple(options["plan"]["presets"])})
    steps, inputs = [], []
    for preset in plan.presets:
        described, rates = step_rates(preset, plan)
        steps.append({**described, "rates": rates})
        cfg = presets.build_config(preset)
        shape_and_batch = (tuple(sources.input_shape(cfg.data)), cfg.train.batch_size)
        if shape_and_batch not in inputs:   # digits and digits-mlp share theirs
            inputs.append(shape_and_batch)
    pipelines = []
    for shape, batch in inputs:
        for source, cfg in _sources(shape, plan.samples, Path(options["work_dir"])).items():
            pipelines.append({"source": source, "shape": list(shape), "batch_size": batch,
                              "rates": pipeline_rates(cfg, batch, plan)})
    Path(options["out"]).write_text(json.dumps({"cores": cores, "threads": options["threads"],
                                                "steps": steps, "pipelines": pipelines}))


# ---------------------------------------------------------------------------------------------
# Driver

def run(out_dir: Path, *, quick: bool = False, threads: int = 1) -> dict[str, Any]:
    machine = host.machine()   # before the work: its load is the machine's own
    plan = QUICK if quick else FULL
    report.say(f"input: {', '.join(plan.presets)} against every source, {threads} core(s)...")
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        out = Path(tmp) / "input.json"
        options = {"plan": asdict(plan), "threads": threads, "work_dir": tmp, "out": str(out)}
        output = jobs.run_job(launch.rank_argv(MODULE, options),
                                timeout=1800, what="input pipeline benchmark")
        raw = jobs.read_json_output(out, "input pipeline benchmark", output)
    rows = compare(raw)
    for r in rows:
        report.say(f"  {r['model']:<12} {r['source']:<17} pipeline "
                   f"{r['pipeline_samples_per_sec']['median']:>10,.0f}  step "
                   f"{r['step_samples_per_sec']['median']:>8,.0f}  x{r['ratio']:.1f}")
    result = {"benchmark": "input", "machine": machine, "plan": asdict(plan),
              "goal": GOAL, "threads": threads, "cores": raw["cores"], "results": rows,
              "raw": raw}
    report.write_outputs(out_dir, "input", result, markdown(result))
    plot(out_dir, result)
    return result


def markdown(result: dict[str, Any]) -> str:
    plan = result["plan"]
    rows = []
    for r in result["results"]:
        p, s = r["pipeline_samples_per_sec"], r["step_samples_per_sec"]
        rows.append([r["model"], f"{'x'.join(map(str, r['shape']))}, {r['batch_size']}",
                     r["source"], f"{p['median']:,.0f} ({p['min']:,.0f}..{p['max']:,.0f})",
                     f"{s['median']:,.0f}", f"{r['ratio']:.1f}x",
                     "yes" if r["meets_goal"] else "**no**"])
    return "\n".join([
        f"One rank's input pipeline against its training step, {result['threads']} core(s) "
        f"and intra-op thread(s); samples/s, median (min..max) of {plan['repeats']} repeats of "
        f"{plan['seconds']:g} s; goal: pipeline >= {result['goal']:g} x step.", "",
        report.markdown_table(["model", "input, batch", "source", "pipeline samples/s",
                               "step samples/s", "pipeline / step",
                               f">= {result['goal']:g}x"], rows)])


def plot(out_dir: Path, result: dict[str, Any]) -> None:
    groups: dict[str, dict[str, float]] = {}
    for r in result["results"]:
        groups.setdefault(r["model"], {})[r["source"]] = r["ratio"]
    plots.plot_bars(out_dir / "input.png", groups, title="Input pipeline / training step",
                     ylabel="pipeline samples/s / step samples/s", logy=True,
                     reference=result["goal"], reference_label=f"goal {result['goal']:g}x")



# ---------------------------------------------------------------------------------------------
# Command line: hvdtrain bench input

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench input's options."""
    parser.add_argument("--threads", type=int, default=1,
                        help="the rank's cores and intra-op threads (default 1: one core "
                             "per rank, as bench scaling)")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench input``; UserError when --threads is more than this process's cores."""
    cores = len(os.sched_getaffinity(0))
    if not 1 <= args.threads <= cores:
        raise UserError(f"--threads={args.threads}: expected 1 to the {cores} cores this "
                        f"process may use")
    run(Path(args.out), quick=args.quick, threads=args.threads)


BENCHMARK = registry.Benchmark(
    name="input", help="one rank's input pipeline against its training step, every source "
                       "and bundled model (samples/s)",
    main=main, add_arguments=add_arguments, in_all=True,
    title="Input pipeline against the training step", options_in_all=False)


if __name__ == "__main__":
    launch.rank_entry(sys.argv, rank_main, MODULE)
