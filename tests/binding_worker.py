"""Launched by tests/multirank/test_binding.py: the library pattern (a user's own ``fit`` with
``dist.distributed_optimizer`` and ``dist.fit_callbacks()``) on several models in turn, in ONE
job, saving what every rank ends with; at 1 rank it is the replay at twice the batch."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hvdtrain import launching  # TensorFlow loads in main(), through launching

SAMPLES, FEATURES, VOCAB, CLASSES = 64, 6, 64, 4


def dense_first_model(num_classes=CLASSES):
    """A subclassed model that creates its Dense layer before its Embedding: its dense
    gradients come before the embedding's sparse one."""
    import tensorflow as tf

    class DenseFirst(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(num_classes)
            self.embed = tf.keras.layers.Embedding(VOCAB, 8)
            self.flat = tf.keras.layers.Flatten()

        def call(self, x):
            x = self.flat(x)  # images too, for the CLI
            # Column 0 holds a row's own id: no id twice in a batch, since Keras 3's Adam
            # (measured) updates its second moment per slice, so repeated ids would make the
            # result depend on how the batch is split over ranks.
            ids = tf.cast(x[:, 0], tf.int32) % VOCAB
            return self.dense(tf.concat([x[:, 1:], self.embed(ids)], axis=1))

    return DenseFirst()


def dense_first_on_input(input_shape, num_classes):
    """The CLI's ``--model binding_worker:dense_first_on_input``: the same model on an Input
    (the CLI needs known shapes); its variables keep their order, the dense ones first."""
    import tensorflow as tf
    inputs = tf.keras.Input(input_shape)
    return tf.keras.Model(inputs, dense_first_model(num_classes)(inputs))


def no_input_model():
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"),
                                tf.keras.layers.Dense(CLASSES)])


def data(rank: int, size: int, batch: int):
    """Rank ``rank``'s shard: its B rows of every 2B-row global batch, so 1 rank at 2B sees
    each global batch whole, in the same order."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    x[:, 0] = np.arange(SAMPLES)  # each row's id, for the embedding
    y = rng.integers(0, CLASSES, SAMPLES)
    rows = np.arange(SAMPLES).reshape(-1, size, batch)[:, rank].ravel()
    return x[rows], y[rows]


def train(model, dist, world, options, batch: int, epochs: int = 2):
    import tensorflow as tf
    optimizer = dist.distributed_optimizer(tf.keras.optimizers.Adam(0.01), options)
    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(world.rank, world.size, batch)
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0,
              callbacks=dist.fit_callbacks())
    return model


# The broadcasts of earlier versions, for the controls: at on_train_begin only, when nothing
# is built yet (the ranks part ways), and after the first step, as Horovod's Keras 2 callback
# does (the ranks agree, but their first step started from different weights).
OLD_BROADCASTS = {"no_input_at_begin_only": ("_build_and_broadcast_at_first_step",
                                             "on_train_batch_end"),
                  "no_input_after_first_step": ("_build_and_broadcast_at_first_step",)}


def old_broadcast_runs(dist, world, options, batch: int) -> dict:
    """The no-Input case under each of OLD_BROADCASTS."""
    import tensorflow as tf
    from hvdtrain.distributed import keras3
    save = {}
    for case, left_out in OLD_BROADCASTS.items():
        kept = {name: getattr(keras3.BroadcastInitialState, name) for name in left_out}
        for name in left_out:
            setattr(keras3.BroadcastInitialState, name, lambda *args, **kwargs: None)
        tf.keras.utils.set_random_seed(100 + world.rank)
        save[case] = train(no_input_model(), dist, world, options, batch).get_weights()
        for name, method in kept.items():
            setattr(keras3.BroadcastInitialState, name, method)
    return save


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--old-broadcasts", action="store_true",
                        help="the controls: the no-Input case under the broadcasts of earlier "
                             "versions (Keras 3)")
    args = parser.parse_args()
    launching.load_tensorflow()
    import tensorflow as tf
    from hvdtrain import distributed as dist
    from hvdtrain.config import HorovodConfig
    world = dist.init()
    options = HorovodConfig()
    if args.old_broadcasts:
        save_all(args.out, world.rank, old_broadcast_runs(dist, world, options, args.batch))
        return
    save = {}

    # Bug 1 and the exact broadcast: built before fit, so N ranks at B equal 1 rank at N x B.
    tf.keras.utils.set_random_seed(100 + world.rank)
    model = dense_first_model()
    model(np.zeros((1, FEATURES), "float32"))  # a subclassed model's build() creates nothing
    save["dense_first"] = train(model, dist, world, options, args.batch).get_weights()

    # Bug 2: no Input and never built: fit builds it in its first step.
    tf.keras.utils.set_random_seed(100 + world.rank)
    save["no_input"] = train(no_input_model(), dist, world, options, args.batch).get_weights()

    # Adam's state restored on rank 0 only (its step count and slots, as a checkpoint would
    # load them) reaches every rank.
    tf.keras.utils.set_random_seed(100 + world.rank)
    model = no_input_model()
    model.build((None, FEATURES))
    optimizer = dist.distributed_optimizer(tf.keras.optimizers.Adam(0.01), options)
    if world.rank == 0:
        optimizer.build(model.trainable_variables)
        for variable in dist.optimizer_variables(optimizer):
            variable.assign(tf.fill(variable.shape, tf.cast(0.5, variable.dtype)))
        optimizer.iterations.assign(7)
    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(world.rank, world.size, args.batch)
    model.fit(x[:args.batch], y[:args.batch], batch_size=args.batch, epochs=1, verbose=0,
              callbacks=dist.fit_callbacks())
    save["restored"] = [v.numpy() for v in dist.optimizer_variables(optimizer)]
    save_all(args.out, world.rank, save)
    checks = refusal_checks(dist)
    checks.update(single_rank_checks(dist) if world.size == 1
                  else two_rank_checks(dist, world.rank))
    (args.out / f"checks.rank{world.rank}.json").write_text(json.dumps(checks))


def save_all(out: Path, rank: int, save: dict) -> None:
    for case, arrays in save.items():
        np.savez(out / f"{case}.rank{rank}.npz", *arrays)


def two_rank_checks(dist, rank: int) -> dict:
    """At 2 ranks: float32 and float16 gradients in one step, and a rank with no batch at all
    joining at once while its peer reduces its one batch."""
    import tensorflow as tf
    from hvdtrain.config import HorovodConfig
    reduce = tf.function(lambda *grads: dist.reduce_gradients(grads, HorovodConfig()))
    mixed = reduce(tf.constant([1.0 + rank], tf.float32), tf.constant([2.0 + 2 * rank], tf.float16))
    joined = reduce(tf.constant([4.0]))[0].numpy().tolist() if rank == 0 else None
    checks = {"mixed": [float(g.numpy()[0]) for g in mixed],
              "mixed_dtypes": [g.dtype.name for g in mixed],
              "joined": joined, "last_to_join": dist.join()}
    if dist.keras_version().startswith("3."):
        checks.update(metric_checks(dist, rank))
    return checks


def metric_checks(dist, rank: int) -> dict:
    """Keras 3's metric averaging: an array metric averaged element-wise, and metrics that
    differ in name between the ranks (one each, so their counts match) refused."""
    averaged = {"loss": 1.0 + rank, "per_class": np.array([1.0, 2.0 + 2 * rank])}
    dist.metric_average_callback().on_epoch_end(0, averaged)
    return {"averaged": {name: np.asarray(value).tolist() for name, value in averaged.items()},
            "other_names": refusal(lambda: dist.metric_average_callback().on_epoch_end(
                0, {"accuracy" if rank == 0 else "mae": 0.5}))}


def horovod_ops(function, *args) -> list[str]:
    import tensorflow as tf
    graph = tf.function(function).get_concrete_function(*args).graph
    return [op.type for op in graph.get_operations() if "Horovod" in op.type]


def refusal(action) -> str:
    from hvdtrain.errors import UserError
    try:
        action()
    except UserError as e:
        return str(e)
    return ""


def single_rank_checks(dist) -> dict:
    """At world size 1: the reducer passes the gradients through, with no Horovod op."""
    import tensorflow as tf
    import horovod.tensorflow as hvd
    from hvdtrain.config import HorovodConfig
    fp16 = HorovodConfig(compression="fp16")
    pi = tf.constant([3.14159265], tf.float32)
    return {
        "passed_through": dist.reduce_gradients([pi], fp16)[0].numpy().tolist(),
        "fp16_round_trip": tf.cast(tf.cast(pi, tf.float16), tf.float32).numpy().tolist(),
        "reducer_ops": horovod_ops(lambda g: dist.reduce_gradients([g], fp16), pi),
        "allreduce_ops": horovod_ops(lambda g: hvd.allreduce(g), pi),  # Horovod: the control
    }


def refusal_checks(dist) -> dict:
    """At any world size, on every rank: the binding's one-line refusals, and an optimizer's
    state set outside its config kept by the wrapper."""
    import tensorflow as tf
    from hvdtrain.config import HorovodConfig
    model = no_input_model()
    model.build((None, FEATURES))

    def tape_then_distributed_optimizer():
        optimizer = dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1), HorovodConfig())
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones((2, FEATURES))))
        grads = dist.distributed_tape(tape, HorovodConfig()).gradient(
            loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    def weight_decay_after_wrapping() -> dict:
        # Set outside the optimizer's config: kept by the wrapper (a rebuild from the config
        # would drop it). The loss has no gradient, so weight decay alone moves the weights.
        optimizer = tf.keras.optimizers.AdamW(0.1, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        dense = tf.keras.layers.Dense(2, bias_initializer="ones")
        decayed = tf.keras.Sequential([tf.keras.Input((FEATURES,)), dense])
        decayed.compile(dist.distributed_optimizer(optimizer, HorovodConfig()), jit_compile=False,
                        loss=lambda y, p: 0.0 * tf.reduce_sum(p))
        kernel = dense.kernel.numpy()
        decayed.fit(np.ones((4, FEATURES), "float32"), np.zeros((4, 2), "float32"), verbose=0)
        return {"bias": dense.bias.numpy().tolist(),
                "kernel_decayed": bool(np.abs(dense.kernel.numpy()).sum() < np.abs(kernel).sum())}

    checks = {
        "weight_decay": weight_decay_after_wrapping(),
        "double_reduction": refusal(tape_then_distributed_optimizer),
        "adasum_in_fit": refusal(lambda: dist.distributed_optimizer(
            tf.keras.optimizers.SGD(0.1), HorovodConfig(op="adasum"))),
    }
    if dist.keras_version().startswith("3."):
        pi = tf.constant([3.14159265], tf.float32)
        checks["unscale"] = refusal(lambda: dist.unscale_gradients(
            tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1)), [pi]))
        checks["accumulation_steps"] = refusal(lambda: dist.distributed_optimizer(
            tf.keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), HorovodConfig()))
    return checks


if __name__ == "__main__":
    main()
