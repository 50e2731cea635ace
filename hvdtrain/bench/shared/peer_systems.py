"""The systems bench peers compares on the demo job (digits, cnn), their rank side:
``python -m hvdtrain.bench.shared.peer_systems rank OPTIONS`` (see bench peers' docstring)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hvdtrain.launch import placement
from hvdtrain.bench.shared import launch

MODULE = "hvdtrain.bench.shared.peer_systems"
SYSTEMS = ("single", "hvdtrain", "hvdtrain-gloo", "mwms", "ps")
LAUNCH = {"single": ("single", 1), "hvdtrain": ("mpi", 2), "hvdtrain-gloo": ("gloo", 2)}
WORKERS = 2
BATCH = 32


# ---------------------------------------------------------------------------------------------
# Rank side: shared pieces

def _config(epochs: int):
    from hvdtrain.config import presets
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
    from hvdtrain.models import registry
    from hvdtrain.data import sources

    dataset = sources.load(cfg.data, cfg.train.seed)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    with strategy_scope:
        model = registry.build(cfg.model, dataset.input_shape, dataset.num_classes)
    twin = registry.build(cfg.model, dataset.input_shape, dataset.num_classes)

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
    from hvdtrain.training import schedules

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
    """hvdtrain's own optimizer, loss and metric (registry.base_optimizer, compile_classifier)."""
    from hvdtrain.models import registry
    registry.compile_classifier(model, registry.base_optimizer(cfg.optim, learning_rate=lr))


# ---------------------------------------------------------------------------------------------
# Rank side: each system

def rank_hvdtrain(options: dict[str, Any]) -> None:
    """single and hvdtrain: hvdtrain's own Trainer, with its defaults."""
    if options["system"] == "single":
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, like a rank
    from hvdtrain.training import trainer
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


if __name__ == "__main__":
    launch.rank_entry(sys.argv, rank_main, MODULE)
