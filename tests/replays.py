"""What the multi-rank tests of the custom loop, Horovod's options and the learning-rate schedule
share (tests/multirank/test_custom_loop.py, test_horovod_options.py,
test_schedules_multirank.py): a 2-rank run of tests/multirank_worker.py and its ranks' final
weights, the gradient all-reduces a Horovod timeline shows, and replays in this process, with
plain TensorFlow, of what the 2 ranks must have computed."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Callable

import numpy as np

from helpers import assert_ok, largest_difference, launch, weights, worker
from hvdtrain.bench.shared.timeline import PLACES, tensor_names

CUSTOM = ["--set", "train.loop=custom"]


def train(launcher: str, np_: int, out: Path, *args: str,
          run_dir: Path | None = None) -> list[list[np.ndarray]]:
    """Runs the test worker and returns every rank's final weights."""
    run_dir = run_dir or out / "run"
    job = launch(launcher, np_, worker(out, *args, "--set", f"run.run_dir={run_dir}"))
    assert_ok(job, f"{launcher} x{np_} {' '.join(args)}")
    return [weights(out / f"rank{r}.npz") for r in range(np_)]


def assert_same(a: list[np.ndarray], b: list[np.ndarray], atol: float) -> float:
    """Asserts equal shapes and values to ``atol``; returns the largest difference."""
    worst = largest_difference(a, b)
    assert worst <= atol, f"largest difference {worst} > {atol}"
    return worst


# The tensors of a gradient reduction: named by the tape (custom loop: "gradient_tape_...",
# "DistributedGradientTape_Allreduce/...") or by the optimizer (fit: "DistributedSGD_Allreduce/
# ..."); the metric sums are plain "HorovodAllreduce".
GRADIENT_TENSOR = re.compile(r"grad|Distributed\w*_Allreduce", re.IGNORECASE)


def gradient_allreduces(timeline: Path, kind: str = "ALLREDUCE") -> tuple[int, int]:
    """From a Horovod timeline (Chrome trace JSON): the number of gradient all-reduces (or
    another ``kind`` of collective) and the bytes they carried, read from each one's end event
    (dtype and shape of the tensor)."""
    events = json.loads(timeline.read_text())
    tensor_of = tensor_names(events)
    open_activities: dict[int, list[str]] = {}
    count = total = 0
    for e in events:
        if e["ph"] == "B":
            open_activities.setdefault(e["pid"], []).append(e["name"])
        elif e["ph"] == "E" and open_activities[e["pid"]].pop() == kind:
            name = tensor_of[e["pid"]]
            if not GRADIENT_TENSOR.search(name) or name.endswith(PLACES):
                continue  # the metric sums and the reducer's check, not gradients
            shape = json.loads(e["args"]["shape"])
            count += 1
            total += math.prod(shape) * np.dtype(e["args"]["dtype"]).itemsize
    return count, total

# ---------------------------------------------------------------------------------------------
# Replays in this process, with plain TensorFlow: what the 2 ranks must have computed.


PLAIN_SGD = ["optim.momentum=0", "optim.lr_scaling=none", "optim.warmup_epochs=0",
             "optim.lr=0.1", "data.shuffle=false"]


def initial_model(preset: str, assignments: list[str]):
    """The config, the data and the model every rank starts from (as Trainer builds them)."""
    import tensorflow as tf
    from hvdtrain.models import registry
    from hvdtrain.config import presets
    from hvdtrain.data import sources
    cfg = presets.build_config(preset, None, assignments)
    dataset = sources.load(cfg.data, cfg.train.seed)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    tf.keras.mixed_precision.set_global_policy("float32")
    return cfg, dataset, registry.build(cfg.model, dataset.input_shape, dataset.num_classes)


def local_gradients(model, x, y) -> list[np.ndarray]:
    """One rank's gradients of the mean loss on its batch (sparse ones made dense)."""
    import tensorflow as tf
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
            y, model(x, training=True), from_logits=True))
    return [tf.convert_to_tensor(g).numpy().astype(np.float64)
            for g in tape.gradient(loss, model.trainable_variables)]


def sgd_step(model, gradients: list[np.ndarray], lr: float) -> None:
    for v, g in zip(model.trainable_variables, gradients):
        v.assign(v.numpy() - lr * g.astype(np.float32))


def mean(gradients: tuple[np.ndarray, ...]) -> np.ndarray:
    return sum(gradients) / len(gradients)


def replay_two_ranks(cfg, dataset, model, *, lr_at: Callable[[int], float],
                     combine: Callable[[tuple[np.ndarray, ...]], np.ndarray] = mean
                     ) -> list[np.ndarray]:
    """Plain SGD as 2 ranks run it for cfg.train.epochs: at every step each rank's gradient on
    its own batch (the batches sources.train_dataset gives that rank), combined, one update at
    ``lr_at(step)``. Returns the final weights."""
    from hvdtrain.data import sources
    streams = [sources.train_dataset(dataset.train, rank=r, size=2,
                                  batch_size=cfg.train.batch_size, first_epoch=0,
                                  epochs=cfg.train.epochs, seed=cfg.train.seed,
                                  shuffle=cfg.data.shuffle) for r in range(2)]
    batches = [iter(s.dataset) for s in streams]
    for step in range(cfg.train.epochs * streams[0].steps_per_epoch):
        grads = [local_gradients(model, *next(b)) for b in batches]
        sgd_step(model, [combine(g) for g in zip(*grads)], lr_at(step))
    return model.get_weights()
