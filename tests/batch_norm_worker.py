"""Launched by tests/multirank/test_batch_norm.py: BatchNormalization through a library user's
own ``fit`` (``dist.distributed_optimizer``, ``dist.fit_callbacks()``), several cases in ONE
job, saving what every rank holds; and the CLI's user model (``conv_bn_dense``).

- ``statistics``: a Conv-BN-Dense model (the Conv and BN in a nested model, a Dropout, each
  rank its own data) with ``validation_data``; every rank's moving statistics after each epoch
  and after ``fit``, and its own validation loss. ``statistics_control``: the same without
  the statistics average (``fit_callbacks()`` less it).
- ``sync``, ``swapped`` and ``plain``: each rank its B rows of every 2B-row global batch, one
  epoch of plain SGD, with ``dist.SyncBatchNormalization``, with plain layers synchronized by
  ``dist.synchronize_batch_norm`` (what ``model.sync_batch_norm`` does), and plain (the
  control); at 1 rank (batch 2B) they are the replay.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hvdtrain.launch import rank_process  # TensorFlow loads in main(), through rank_process

SHAPE, CLASSES, SAMPLES = (6, 6, 2), 4, 64


def conv_bn_dense(input_shape, num_classes, norm=None):
    """Conv, BatchNormalization, ReLU, Dense: the CLI's ``--model
    batch_norm_worker:conv_bn_dense``. ``norm``: the normalization layer's class."""
    import tensorflow as tf
    layers = tf.keras.layers
    inputs = tf.keras.Input(input_shape)
    x = layers.Conv2D(8, 3, padding="same")(inputs)
    x = (norm or layers.BatchNormalization)()(x)
    x = layers.Flatten()(layers.ReLU()(x))
    return tf.keras.Model(inputs, layers.Dense(num_classes)(x))


def nested_model():
    """The Conv and its BatchNormalization inside a nested model, then a Dropout (on Keras 3
    an integer seed state: not a statistic)."""
    import tensorflow as tf
    layers = tf.keras.layers
    inputs = tf.keras.Input(SHAPE)
    block = tf.keras.Sequential([tf.keras.Input(SHAPE), layers.Conv2D(4, 3, padding="same"),
                                 layers.BatchNormalization()])
    x = layers.Dropout(0.1)(layers.Flatten()(layers.ReLU()(block(inputs))))
    return tf.keras.Model(inputs, layers.Dense(CLASSES)(x))


def compiled(model, dist, optimizer):
    import tensorflow as tf
    model.compile(optimizer=dist.distributed_optimizer(optimizer), jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def statistics_case(dist, world, callbacks) -> dict:
    """Each rank's data its own (another mean per rank), 2 epochs of batch 8."""
    import tensorflow as tf

    class Record(tf.keras.callbacks.Callback):
        """After the callbacks before it: each epoch's statistics, each validation's loss."""

        def __init__(self):
            super().__init__()
            self.saved, self.validation = {}, []

        def on_test_end(self, logs=None):
            self.validation.append(float(logs["loss"]))  # this rank's own, not yet averaged

        def on_epoch_end(self, epoch, logs=None):
            self.saved[f"epoch{epoch}"] = statistics(dist, self.model)

    tf.keras.utils.set_random_seed(0)
    model = compiled(nested_model(), dist, tf.keras.optimizers.SGD(0.05))
    rng = np.random.default_rng(world.rank)
    x = rng.normal(world.rank, 1.0 + world.rank, size=(SAMPLES, *SHAPE)).astype("float32")
    y = rng.integers(0, CLASSES, SAMPLES)
    held = np.random.default_rng(99)
    validation = (held.normal(size=(16, *SHAPE)).astype("float32"),
                  held.integers(0, CLASSES, 16))
    record = Record()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=validation,
              callbacks=[*callbacks, record])
    return {**record.saved, "end": statistics(dist, model), "validation": record.validation}


def statistics(dist, model) -> list:
    return [np.asarray(v.numpy()).tolist() for v in dist.normalization_statistics(model)]


def global_batches(rank: int, size: int, batch: int):
    """Rank ``rank``'s B rows of every (size x B)-row global batch, in order."""
    rng = np.random.default_rng(7)
    x = rng.normal(0.5, 2.0, size=(SAMPLES, *SHAPE)).astype("float32")
    y = rng.integers(0, CLASSES, SAMPLES)
    rows = np.arange(SAMPLES).reshape(-1, size, batch)[:, rank].ravel()
    return x[rows], y[rows]


def replay_case(dist, world, batch: int, case: str) -> list[np.ndarray]:
    """One epoch of plain SGD on the global batches: every rank its B rows of each."""
    import tensorflow as tf
    tf.keras.utils.set_random_seed(0)  # every rank, and the replay, start alike
    model = conv_bn_dense(SHAPE, CLASSES, dist.SyncBatchNormalization if case == "sync" else None)
    if case == "swapped":
        assert dist.synchronize_batch_norm(model) == 1
    compiled(model, dist, tf.keras.optimizers.SGD(0.1))
    x, y = global_batches(world.rank, world.size, batch)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=dist.fit_callbacks())
    return model.get_weights()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    rank_process.load_tensorflow()
    from hvdtrain import distributed as dist
    from hvdtrain.distributed.batch_norm import StatisticsAverage
    world = dist.init()
    out = {}
    if world.size > 1:
        # Without the global metrics, which would make the validation losses equal whatever
        # statistics each rank scored with: each rank's own loss shows its statistics.
        out["statistics"] = statistics_case(dist, world, dist.fit_callbacks(global_metrics=False))
        out["statistics_control"] = statistics_case(dist, world, [
            c for c in dist.fit_callbacks(global_metrics=False)
            if not isinstance(c, StatisticsAverage)])
    (args.out / f"statistics.rank{world.rank}.json").write_text(json.dumps(out))
    for case in ("sync", "swapped", "plain"):
        np.savez(args.out / f"{case}.rank{world.rank}.npz",
                 *replay_case(dist, world, args.batch, case))


if __name__ == "__main__":
    main()
    rank_process.end_rank()
