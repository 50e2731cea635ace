"""hvdtrain against the reference notes' systems, on the same work.

The same model (hvdtrain's ``cnn``), data (scikit-learn's ``digits``: 1,437 train / 360 eval),
per-replica batch (32), optimizer (SGD, momentum 0.9) and seed, under:

- ``single``: hvdtrain in one process alone (lr 0.05);
- ``hvdtrain``: 2 ranks, Horovod ring all-reduce (``mpirun -np 2``, hvdtrain's defaults): global
  batch 64, lr 0.05 per rank scaled to 0.1 over a one-epoch warmup;
- ``hvdtrain-gloo``: the same job under ``horovodrun --gloo`` (ranks unbound), as
  ``run_scripts/local.sh`` launches it where mpirun is missing: Gloo against MPI on the demo job;
- ``mwms``: tf.distribute ``MultiWorkerMirroredStrategy``, 2 worker processes with TF_CONFIG on
  localhost ports (synchronous, all-reduce over gRPC): global batch 64, the same lr schedule;
- ``ps``: tf.distribute ``ParameterServerStrategy``, one coordinator, one parameter server and
  2 workers as local processes (asynchronous: every worker step applies its own batch of 32 at
  lr 0.05, the one-process lr, the same number of samples per epoch).

Every worker (or rank) has one intra-op thread and is bound to a core of its own, except under
``ps``: a ParameterServerStrategy worker bound to one core hangs in its first step (TF 2.15,
measured), so its processes (workers, parameter server, coordinator) are unbound, with one
intra-op thread each. Each epoch ends with an exact evaluation on all 360 eval samples.
Reported: samples/s (the median epoch after the first, which traces), and the time from the
start of training to the end of the first epoch with eval accuracy >= 95%.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from hvdtrain import launchers, placement
from hvdtrain.bench import common, registry

SYSTEMS = ("single", "hvdtrain", "hvdtrain-gloo", "mwms", "ps")
LAUNCH = {"single": ("single", 1), "hvdtrain": ("mpi", 2), "hvdtrain-gloo": ("gloo", 2)}
ROUNDS, QUICK_ROUNDS = 3, 1
GLOO_TARGET = 0.95   # issue 28, item 4: the Gloo path >= 0.95x the MPI path on the demo job
# tf.distribute's multi-worker strategies train with Keras 2's fit only. On Keras 3 (TensorFlow
# 2.16 and later) fit under MultiWorkerMirroredStrategy stops converting its PerReplica inputs
# (measured with TF 2.18/Keras 3.15; keras-team/keras#20585, open), and Keras 3 has neither
# ParameterServerStrategy support nor the DatasetCreator that feeds it.
UNAVAILABLE_ON_KERAS3 = {
    "mwms": "Keras 3's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585)",
    "ps": "Keras 3's fit has no ParameterServerStrategy support (no DatasetCreator)"}
WORKERS = 2
BATCH = 32
TARGET_ACCURACY = 0.95
FULL_EPOCHS, QUICK_EPOCHS = 10, 3


def epoch_rates(epoch_ends: Sequence[float], samples_per_epoch: int) -> list[float]:
    """samples/s of each epoch after the first (which includes tracing), from the times at
    which the epochs ended (seconds since training began)."""
    return [samples_per_epoch / (b - a) for a, b in zip(epoch_ends, epoch_ends[1:])]


def time_to_accuracy(epoch_ends: Sequence[float], accuracies: Sequence[float],
                     target: float = TARGET_ACCURACY) -> float | None:
    """Seconds at the end of the first epoch whose accuracy reaches ``target``, or None."""
    for seconds, accuracy in zip(epoch_ends, accuracies):
        if accuracy >= target:
            return seconds
    return None


# ---------------------------------------------------------------------------------------------
# Rank side: shared pieces

def _config(epochs: int):
    from hvdtrain import presets
    return presets.build_config("digits", assignments=[
        f"train.epochs={epochs}", f"train.batch_size={BATCH}", "train.eval_every=1"])


def _epoch_log(evaluate=None):
    """A callback recording, at each epoch end, the seconds since training began and the eval
    accuracy: from the logs (hvdtrain's exact evaluation) or from ``evaluate()``."""
    import tensorflow as tf

    class EpochLog(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.ends: list[float] = []
            self.accuracies: list[float] = []
            self._start = 0.0

        def on_train_begin(self, logs: dict | None = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            accuracy = evaluate() if evaluate else float((logs or {})["eval_accuracy"])
            self.accuracies.append(accuracy)
            self.ends.append(time.perf_counter() - self._start)
    return EpochLog()


def _limit_threads(inter_op: int = 1) -> None:
    """One intra-op thread, like an hvdtrain rank on one core. The processes of ``ps`` need 2
    inter-op threads: with one, a worker's function waiting on a receive from the parameter
    server blocks the only thread, and training hangs."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def _write(path: str, log, samples_per_epoch: int, **extra: Any) -> None:
    Path(path).write_text(json.dumps({"epoch_ends": log.ends, "accuracies": log.accuracies,
                                      "samples_per_epoch": samples_per_epoch,
                                      "cores": sorted(os.sched_getaffinity(0)), **extra}))


def _keras_parts(cfg, strategy_scope):
    """The data, and the model compiled inside ``strategy_scope`` with a local twin that scores
    the whole eval set with the distributed model's current weights."""
    import numpy as np
    import tensorflow as tf
    from hvdtrain import models
    from hvdtrain.data import sources

    dataset = sources.load(cfg.data, cfg.train.seed)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    with strategy_scope:
        model = models.build(cfg.model, dataset.input_shape, dataset.num_classes)
    twin = models.build(cfg.model, dataset.input_shape, dataset.num_classes)

    def evaluate() -> float:
        twin.set_weights(model.get_weights())
        # A plain call: Keras' predict would join the strategy's collectives.
        logits = twin(dataset.eval.x, training=False).numpy()
        return float(np.mean(np.argmax(logits, axis=1) == dataset.eval.y))
    return dataset, model, evaluate


def _warmup_schedule(cfg, peak_lr: float, warmup_steps: int):
    """hvdtrain's schedule (schedules.lr_at_step) as a Keras schedule, for the strategies that
    have no hvdtrain callback: the same pure function, called from the graph (constant after
    the warmup, as the digits preset is)."""
    import numpy as np
    import tensorflow as tf
    from hvdtrain import schedules

    def lr_at(step) -> float:
        return schedules.lr_at_step(int(step), base_lr=cfg.optim.lr, peak_lr=peak_lr,
                                    warmup_steps=warmup_steps, total_steps=1,
                                    decay="constant")

    class Warmup(tf.keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            lr = tf.numpy_function(lambda s: np.float32(lr_at(s)), [tf.cast(step, tf.int64)],
                                   tf.float32)
            return tf.reshape(lr, [])

        def get_config(self) -> dict:
            return {"peak_lr": peak_lr, "warmup_steps": warmup_steps}
    return Warmup()


def _compile(model, cfg, lr) -> None:
    """hvdtrain's own optimizer, loss and metric (models.base_optimizer, compile_classifier)."""
    from hvdtrain import models
    models.compile_classifier(model, models.base_optimizer(cfg.optim, learning_rate=lr))


# ---------------------------------------------------------------------------------------------
# Rank side: each system

def rank_hvdtrain(options: dict[str, Any]) -> None:
    """single and hvdtrain: hvdtrain's own Trainer, with its defaults."""
    if options["system"] == "single":
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, like a rank
    from hvdtrain import trainer
    from hvdtrain import distributed as dist
    cfg = _config(options["epochs"])
    world = dist.init(device="cpu")
    log = _epoch_log()
    run = dataclasses.replace(cfg.run, run_dir=options["run_dir"], export=False,
                              tensorboard=False, progress_every_s=0)
    summary = trainer.Trainer(dataclasses.replace(cfg, run=run), world,
                              extra_callbacks=[log]).train()
    if world.is_chief:
        _write(options["out"], log, summary["steps_per_epoch"] * BATCH * world.size,
               intra_op_threads=world.intra_op_threads)


def rank_mwms(options: dict[str, Any]) -> None:
    index = options["index"]
    os.sched_setaffinity(0, {index % placement.cores_available()[1]})
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": options["workers"]},
                                          "task": {"type": "worker", "index": index}})
    import tensorflow as tf
    _limit_threads()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    cfg = _config(options["epochs"])
    dataset, model, evaluate = _keras_parts(cfg, strategy.scope())
    replicas = strategy.num_replicas_in_sync
    global_batch = BATCH * replicas
    steps = -(-len(dataset.train) // global_batch)
    train = (tf.data.Dataset.from_tensor_slices((dataset.train.x, dataset.train.y))
             .shuffle(len(dataset.train), seed=cfg.train.seed).repeat().batch(global_batch))
    shard = tf.data.Options()
    shard.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = train.with_options(shard)
    with strategy.scope():
        _compile(model, cfg, _warmup_schedule(cfg, cfg.optim.lr * replicas, steps))
    log = _epoch_log(evaluate if index == 0 else (lambda: float("nan")))
    model.fit(train, epochs=options["epochs"], steps_per_epoch=steps, verbose=0,
              callbacks=[log])
    if index == 0:
        _write(options["out"], log, steps * global_batch)


def rank_ps_server(options: dict[str, Any]) -> None:
    """A parameter server or worker of ``ps``: a TF server that the coordinator drives."""
    kind, index = options["kind"], options["index"]
    # Not bound to a core: a worker bound to one core hangs in its first step (measured with
    # TF 2.15, even with 4 inter-op threads); one intra-op thread keeps its budget to ~a core.
    import tensorflow as tf
    _limit_threads(inter_op=2)
    cluster = tf.train.ClusterSpec(options["cluster"])
    server = tf.distribute.Server(cluster, job_name=kind, task_index=index, protocol="grpc",
                                  start=True)
    server.join()


def rank_ps_coordinator(options: dict[str, Any]) -> None:
    import tensorflow as tf
    _limit_threads(inter_op=2)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": options["cluster"],
                                          "task": {"type": "chief", "index": 0}})
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    cfg = _config(options["epochs"])
    dataset, model, evaluate = _keras_parts(cfg, strategy.scope())
    steps = WORKERS * -(-len(dataset.train) // (BATCH * WORKERS))  # as many samples as hvdtrain
    x, y, seed = dataset.train.x, dataset.train.y, cfg.train.seed

    def per_worker(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return (tf.data.Dataset.from_tensor_slices((x, y))
                .shard(context.num_input_pipelines, context.input_pipeline_id)
                .shuffle(len(x), seed=seed + context.input_pipeline_id).repeat().batch(BATCH))
    with strategy.scope():
        _compile(model, cfg, cfg.optim.lr)
    log = _epoch_log(evaluate)
    model.fit(tf.keras.utils.experimental.DatasetCreator(per_worker), epochs=options["epochs"],
              steps_per_epoch=steps, verbose=0, callbacks=[log])
    _write(options["out"], log, steps * BATCH)


def rank_main(options: dict[str, Any]) -> None:
    {"single": rank_hvdtrain, "hvdtrain": rank_hvdtrain, "hvdtrain-gloo": rank_hvdtrain,
     "mwms": rank_mwms,
     "ps-server": rank_ps_server, "ps": rank_ps_coordinator}[options["system"]](options)


# ---------------------------------------------------------------------------------------------
# Driver

def _spawn(options: dict[str, Any], log: Path, python: str = sys.executable
           ) -> subprocess.Popen:
    """A process of a tf.distribute cluster, its output to ``log`` (a pipe nobody reads could
    fill up and stall it)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(common.rank_argv("hvdtrain.bench.peers", options, python),
                                env=launchers.launch_env(), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _wait_all(procs: Sequence[subprocess.Popen], what: str, timeout: float) -> str:
    """Waits for every process; kills the rest if one fails (it would otherwise wait forever
    for its peer). Returns their output."""
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode != 0:
                tail = "\n".join(proc.log.read_text().splitlines()[-25:])
                raise common.BenchError(f"{what}: a process exited {proc.returncode}\n{tail}")
    except subprocess.TimeoutExpired:
        raise common.BenchError(f"{what} took longer than {timeout:.0f}s") from None
    finally:
        _stop(procs)
    return "\n".join(proc.log.read_text() for proc in procs)


def _stop(procs: Sequence[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


JOB_TIMEOUT_S = 600


def launch(system: str, epochs: int, work_dir: Path,
           python: str = sys.executable) -> dict[str, Any]:
    """One run of ``system`` on the stack of ``python``."""
    work_dir = work_dir / f"{system}-{time.monotonic_ns()}"
    work_dir.mkdir(parents=True)
    out = work_dir / f"{system}.json"
    base = {"system": system, "epochs": epochs, "out": str(out)}
    started = time.perf_counter()
    if system in LAUNCH:
        options = {**base, "run_dir": str(work_dir / f"run-{system}")}
        launcher, ranks = LAUNCH[system]
        output = common.run_job(common.launch_command(
            launcher, ranks, common.rank_argv("hvdtrain.bench.peers", options, python)),
            timeout=JOB_TIMEOUT_S, what=f"peers: {system}")
    elif system == "mwms":
        workers = [f"localhost:{p}" for p in common.free_ports(WORKERS)]
        output = _wait_all([_spawn({**base, "workers": workers, "index": i},
                                   work_dir / f"mwms-{i}.log", python) for i in range(WORKERS)],
                           "peers: mwms", JOB_TIMEOUT_S)
    else:
        ports = common.free_ports(WORKERS + 2)
        cluster = {"chief": [f"localhost:{ports[0]}"], "ps": [f"localhost:{ports[1]}"],
                   "worker": [f"localhost:{p}" for p in ports[2:]]}
        roles = [("ps", 0)] + [("worker", i) for i in range(WORKERS)]
        servers = [_spawn({**base, "system": "ps-server", "cluster": cluster, "kind": kind,
                           "index": i}, work_dir / f"ps-{kind}{i}.log", python)
                   for kind, i in roles]
        try:
            output = _wait_all([_spawn({**base, "cluster": cluster}, work_dir / "ps-chief.log",
                                       python)], "peers: ps", JOB_TIMEOUT_S)
        finally:
            _stop(servers)
    wall = time.perf_counter() - started
    raw = common.read_json_output(out, f"peers: {system}", output)
    rates = epoch_rates(raw["epoch_ends"], raw["samples_per_epoch"])
    return {"samples_per_sec": common.summarize(rates)["median"] if rates else None,
            "seconds_to_95": time_to_accuracy(raw["epoch_ends"], raw["accuracies"]),
            "final_eval_accuracy": raw["accuracies"][-1], "epochs": len(raw["epoch_ends"]),
            "samples_per_epoch": raw["samples_per_epoch"], "wall_seconds_with_startup": wall,
            "raw": raw}


def unavailable(system: str, python: str = sys.executable) -> str | None:
    """Why ``system`` cannot run on the stack of ``python``, or None. (Read from its package
    metadata: the driver loads no TensorFlow.)"""
    if common.stack_versions(python).get("keras", "").startswith("3."):
        return UNAVAILABLE_ON_KERAS3.get(system)
    return None


def plan_systems(python: str, other_python: str | None) -> dict[str, dict[str, Any]]:
    """Per system: the interpreter that runs it (another venv's where this stack cannot and
    that one can), or why it is not run."""
    plan: dict[str, dict[str, Any]] = {}
    for system in SYSTEMS:
        reason = unavailable(system, python)
        if reason is None:
            plan[system] = {"python": python}
        elif other_python and unavailable(system, other_python) is None:
            plan[system] = {"python": other_python, "other_stack_because": reason}
        else:
            plan[system] = {"unavailable": reason}
    return plan


def middle(values: Sequence[float | None]) -> float | None:
    """The median of the rounds that reached a figure (None: none did)."""
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def summarize_system(system: str, runs: list[dict[str, Any]], how: dict[str, Any]
                     ) -> dict[str, Any]:
    """One system over its rounds: medians and spreads of samples/s and of the seconds to 95%,
    how many rounds reached 95%."""
    rates = [r["samples_per_sec"] for r in runs if r["samples_per_sec"] is not None]
    reached = [r["seconds_to_95"] for r in runs if r["seconds_to_95"] is not None]
    return {"system": system, "workers": LAUNCH.get(system, ("", WORKERS))[1],
            "stack": common.stack_line(common.stack_versions(how["python"])),
            **({"other_stack_because": how["other_stack_because"]}
               if "other_stack_because" in how else {}),
            "samples_per_sec": common.summarize(rates) if rates else None,
            "seconds_to_95": common.summarize(reached) if reached else None,
            "rounds_reaching_95": len(reached),
            "final_eval_accuracy": middle([r["final_eval_accuracy"] for r in runs]),
            "wall_seconds_with_startup": middle([r["wall_seconds_with_startup"] for r in runs]),
            "rounds": runs}


def per_round_ratio(runs: dict[str, list[dict[str, Any]]], top: str, bottom: str,
                    key: str = "samples_per_sec") -> dict[str, Any] | None:
    """``top`` / ``bottom`` of ``key`` per round (both measured in it), summarized."""
    pairs = [(a[key], b[key]) for a, b in zip(runs.get(top, []), runs.get(bottom, []))
             if a[key] and b[key]]
    return common.ratio_summary([a / b for a, b in pairs]) if pairs else None


def run(out_dir: Path, *, quick: bool = False, rounds: int | None = None,
        other_python: str | None = None) -> dict[str, Any]:
    machine = common.machine()   # before the work: its load is the machine's own
    epochs = QUICK_EPOCHS if quick else FULL_EPOCHS
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    plan = plan_systems(sys.executable, other_python)
    ran = [s for s in SYSTEMS if "unavailable" not in plan[s]]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in ran}
    loads = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for i in range(rounds):
            loads.append(common.load_average())
            for system in ran if i % 2 == 0 else ran[::-1]:
                where = " (other stack)" if "other_stack_because" in plan[system] else ""
                common.say(f"peers: round {i + 1}/{rounds}, {system}, {epochs} epochs of "
                           f"digits{where}...")
                r = launch(system, epochs, Path(tmp), plan[system]["python"])
                runs[system].append(r)
                common.say(f"  {r['samples_per_sec'] or float('nan'):,.0f} samples/s, eval "
                           f"accuracy {r['final_eval_accuracy']:.3f}, to 95%: "
                           f"{r['seconds_to_95']}")
    rows = []
    for system in SYSTEMS:
        if system not in runs:
            common.say(f"peers: {system}: not run, {plan[system]['unavailable']}")
            rows.append({"system": system, "workers": WORKERS,
                         "unavailable": plan[system]["unavailable"]})
            continue
        row = summarize_system(system, runs[system], plan[system])
        row["hvdtrain_speedup"] = per_round_ratio(runs, "hvdtrain", system)
        rows.append(row)
    result = {"benchmark": "peers", "machine": machine, "epochs": epochs, "rounds": rounds,
              "batch_per_replica": BATCH, "target_accuracy": TARGET_ACCURACY,
              "load_average_before_each_round": loads, "results": rows,
              "gloo_over_mpi": per_round_ratio(runs, "hvdtrain-gloo", "hvdtrain"),
              "gloo_target": GLOO_TARGET}
    common.write_outputs(out_dir, "peers", result, markdown(result))
    plot(out_dir, result)
    return result


def _seconds_cell(r: dict[str, Any], rounds: int) -> str:
    t = r["seconds_to_95"]
    if t is None:
        return "not reached"
    reached = "" if r["rounds_reaching_95"] == rounds else \
        f"; reached in {r['rounds_reaching_95']} of {rounds} rounds"
    return f"{t['median']:.1f} (spread {t['spread']:.1%}{reached})"


def time_verdicts(result: dict[str, Any]) -> list[str]:
    """Item 5's targets: hvdtrain's seconds to 95% <= one process alone's and <= MWMS's, as the
    median over rounds of the per-round ratio hvdtrain / other (both measured in each round),
    with its spread: past the spread limit the verdict is noise."""
    by = {r["system"]: r for r in result["results"]}
    lines = []
    for other in ("single", "mwms"):
        if "unavailable" in by.get(other, {"unavailable": "absent"}):
            lines.append(f"hvdtrain against {other}: {other} not run")
            continue
        pairs = [(a["seconds_to_95"], b["seconds_to_95"]) for a, b in
                 zip(by.get("hvdtrain", {}).get("rounds", []), by[other].get("rounds", []))]
        reached = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not reached:
            lines.append(f"hvdtrain against {other}: no round where both reached 95%")
            continue
        ratio = common.ratio_summary([a / b for a, b in reached])
        lines.append(f"seconds to 95%, hvdtrain / {other}, per round ({len(reached)} of "
                     f"{len(pairs)} rounds): {common.ratio_cell(ratio, 1, at_least=False)}")
    return lines


def markdown(result: dict[str, Any]) -> str:
    rows = []
    rounds = result["rounds"]
    for r in result["results"]:
        if "unavailable" in r:
            rows.append([r["system"], r["workers"], "", f"not run: {r['unavailable']}", "", "",
                         "", ""])
            continue
        s = r["samples_per_sec"]
        stack = r["stack"] + (" (other venv: this stack cannot)" if "other_stack_because" in r
                              else "")
        speedup = r.get("hvdtrain_speedup")
        rows.append([r["system"], r["workers"], stack,
                     f"{s['median']:,.0f} (spread {s['spread']:.1%})" if s else "",
                     common.ratio_cell(speedup) if speedup and r["system"] != "hvdtrain" else "",
                     _seconds_cell(r, rounds), f"{r['final_eval_accuracy']:.3f}",
                     f"{r['wall_seconds_with_startup']:.0f}"])
    gloo = result.get("gloo_over_mpi")
    lines = [
        f"digits, cnn, batch {result['batch_per_replica']} per replica, {result['epochs']} "
        f"epochs, one core per worker, {rounds} interleaved rounds (load before each: "
        f"{', '.join(f'{x:.2f}' for x in result['load_average_before_each_round'])}); "
        f"samples/s: median epoch after the first, then the median over rounds (spread = "
        f"(max - min) / median); hvdtrain / this: per-round ratio of samples/s:", "",
        common.markdown_table(["system", "workers", "stack", "samples/s", "hvdtrain / this",
                               "s to 95% eval acc", "final eval acc",
                               "wall s (with start-up)"], rows), ""]
    lines += [f"- {line}" for line in time_verdicts(result)]
    if gloo:
        lines.append(f"- the demo job under Gloo (`horovodrun --gloo`, as `local.sh` launches "
                     f"it where mpirun is missing) over MPI (`mpirun`), samples/s per round: "
                     f"{common.ratio_cell(gloo, result['gloo_target'])}")
    return "\n".join(lines)


def plot(out_dir: Path, result: dict[str, Any]) -> None:
    """Eval accuracy against time, each system's first round."""
    series = {r["system"]: (r["rounds"][0]["raw"]["epoch_ends"],
                            r["rounds"][0]["raw"]["accuracies"])
              for r in result["results"] if "unavailable" not in r}
    common.plot_lines(out_dir / "peers.png", series,
                      title="Eval accuracy against time (digits, first round)",
                      xlabel="seconds since training began", ylabel="eval accuracy",
                      reference=([0, max(max(xs) for xs, _ in series.values())],
                                 [TARGET_ACCURACY] * 2), reference_label="95%")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench peers' options (bench all's too)."""
    from hvdtrain.bench import tax
    tax.add_other_venv(parser)
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved rounds (default {ROUNDS}; --quick: {QUICK_ROUNDS})")


def main(args: argparse.Namespace) -> None:
    """``hvdtrain bench peers``: what this stack cannot run (MWMS and PS on Keras 3) runs in
    --other-venv's, marked so in the table."""
    from hvdtrain.bench import tax
    run(Path(args.out), quick=args.quick, rounds=args.rounds,
        other_python=tax.venv_python(args.other_venv, "--other-venv"))


BENCHMARK = registry.Benchmark(
    name="peers", help="hvdtrain against MultiWorkerMirroredStrategy, ParameterServerStrategy "
                       "and one process, on digits",
    main=main, add_arguments=add_arguments, title="hvdtrain against tf.distribute's strategies")


if __name__ == "__main__":
    common.rank_entry(sys.argv, rank_main, "hvdtrain.bench.peers")
