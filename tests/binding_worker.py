"""Launched by tests/multirank/test_binding.py: the library pattern (a user's own ``fit`` with
``dist.distributed_optimizer`` and ``dist.fit_callbacks()``) on several models in turn, in ONE
job, saving what every rank ends with; at 1 rank it is the replay at twice the batch."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hvdtrain.launch import rank_process  # TensorFlow loads in main(), through rank_process

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


# horovod.bucket_mb's cases (both stacks), on bucket_model: 0 (one grouped all-reduce), a bucket
# smaller than any gradient (each its own: 6) and one in between (3: the last layer's three
# gradients, the middle kernel alone, the first layer's two).
BUCKET_CASES = {"buckets_none": 0.0, "buckets_each": 0.00001, "buckets_some": 0.0005}


def bucket_model():
    """Three Dense layers: dense gradients of 384, 64, 1024, 64, 256 and 16 bytes."""
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                tf.keras.layers.Dense(16, activation="relu"),
                                tf.keras.layers.Dense(16, activation="relu"),
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


def train(model, dist, world, options, batch: int, epochs: int = 2, check: bool = True):
    """``model`` trained on this rank's rows with dist.fit_callbacks() (its consistency check
    off where ``check`` is: the controls that part ways on purpose)."""
    import tensorflow as tf
    optimizer = dist.distributed_optimizer(tf.keras.optimizers.Adam(0.01), options)
    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(world.rank, world.size, batch)
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0,
              callbacks=dist.fit_callbacks(consistency_check=check))
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
    from hvdtrain.distributed import broadcast
    save = {}
    for case, left_out in OLD_BROADCASTS.items():
        kept = {name: getattr(broadcast.BroadcastInitialState, name) for name in left_out}
        for name in left_out:
            setattr(broadcast.BroadcastInitialState, name, lambda *args, **kwargs: None)
        tf.keras.utils.set_random_seed(100 + world.rank)
        save[case] = train(no_input_model(), dist, world, options, batch,
                           check=False).get_weights()
        for name, method in kept.items():
            setattr(broadcast.BroadcastInitialState, name, method)
    return save


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--old-broadcasts", action="store_true",
                        help="the controls: the no-Input case under the broadcasts of earlier "
                             "versions (Keras 3)")
    args = parser.parse_args()
    rank_process.load_tensorflow()
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

    # horovod.bucket_mb (the reducer's, both stacks): the same model under each bucket size.
    for case, bucket_mb in BUCKET_CASES.items():
        tf.keras.utils.set_random_seed(100 + world.rank)
        save[case] = train(bucket_model(), dist, world, HorovodConfig(bucket_mb=bucket_mb),
                           args.batch).get_weights()

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
    save.update(user_step_cases(dist, world, options, args.batch, args.out))
    save_all(args.out, world.rank, save)
    checks = refusal_checks(dist)
    checks.update(single_rank_checks(dist) if world.size == 1
                  else two_rank_checks(dist, world.rank))
    (args.out / f"checks.rank{world.rank}.json").write_text(json.dumps(checks))


def own_step_model(optimizers: int):
    """A subclassed model with its own ``train_step`` (a tape, then ``apply_gradients``), with
    one optimizer or, GAN-style, two (one per layer)."""
    import tensorflow as tf
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    class OwnStep(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = tf.keras.layers.Dense(16, activation="relu")
            self.out = tf.keras.layers.Dense(CLASSES)

        def call(self, x):
            return self.out(self.hidden(x))

        def train_step(self, batch):
            x, y = batch
            with tf.GradientTape(persistent=True) as tape:
                value = loss(y, self(x, training=True))
            parts = ([self.trainable_variables] if optimizers == 1 else
                     [self.hidden.trainable_variables, self.out.trainable_variables])
            for optimizer, variables in zip(self.optimizers, parts):
                optimizer.apply_gradients(zip(tape.gradient(value, variables), variables))
            return {"loss": value}

    return OwnStep()


def user_step_cases(dist, world, options, batch: int, out: Path) -> dict:
    """Scripts users write: a model of their own with its own train_step (one optimizer, two);
    rank 0 building a model more first (Keras numbers names per process); weights and momentum
    loaded on rank 0 only; a model with Dropout (each rank must draw its own masks)."""
    import tensorflow as tf
    save = {}
    x, y = data(world.rank, world.size, batch)
    for optimizers in (1, 2):
        tf.keras.utils.set_random_seed(5)
        model = own_step_model(optimizers)
        model(x[:1])
        model.optimizers = [dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1), options)
                            for _ in range(optimizers)]
        model.compile(optimizer=model.optimizers[0], jit_compile=False)
        model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0,
                  callbacks=dist.fit_callbacks())
        save[f"own_step_{optimizers}"] = model.get_weights()
    if world.rank == 0:
        no_input_model().build((None, FEATURES))  # one model more: every name numbered on
    tf.keras.utils.set_random_seed(100 + world.rank)
    save["extra_model_first"] = train(no_input_model(), dist, world, options, batch).get_weights()
    save["loaded_on_rank0"] = loaded_on_rank0(dist, world, options, batch, out)
    save["dropout_masks"] = dropout_masks(dist, world, options, batch)
    if dist.keras_version().startswith("3."):
        save["loaded_model"] = loaded_model(dist, world, options, batch, out)
    return save


def loaded_model(dist, world, options, batch: int, out: Path) -> list:
    """Keras 3: a model saved with its optimizer's state (each rank its own, trained a step
    alone), loaded, its optimizer made distributed and trained on: rank 0's state goes on."""
    import tensorflow as tf
    tf.keras.utils.set_random_seed(20 + world.rank)
    model = no_input_model()
    model.compile(tf.keras.optimizers.Adam(0.01), jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    first, labels = data(0, 1, batch)  # the same 8 rows at any world size and batch
    model.fit(first[:8], labels[:8], batch_size=8, verbose=0)
    path = out / f"saved.rank{world.rank}.keras"
    model.save(path)
    model = tf.keras.models.load_model(path)
    model.compile(dist.distributed_optimizer(model.optimizer, options), jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(world.rank, world.size, batch)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=dist.fit_callbacks())
    return [*model.get_weights(), *[v.numpy() for v in model.optimizer.variables]]


def loaded_on_rank0(dist, world, options, batch: int, out: Path) -> list:
    """Weights and SGD momentum that rank 0 alone loads, as from its checkpoint: step 1
    already starts from them on every rank."""
    import tensorflow as tf
    model = no_input_model()
    model.build((None, FEATURES))
    optimizer = dist.distributed_optimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9), options)
    if world.rank == 0:
        model.set_weights([np.random.default_rng(9).normal(size=w.shape).astype(w.dtype) * 0.3
                           for w in model.get_weights()])
        optimizer.build(model.trainable_variables)  # the momentum, as a checkpoint restores it
        for variable in dist.optimizer_variables(optimizer):
            if tf.as_dtype(variable.dtype).is_floating:
                variable.assign(tf.fill(variable.shape, tf.cast(0.01, variable.dtype)))
    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(world.rank, world.size, batch)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=dist.fit_callbacks())
    return model.get_weights()


def dropout_masks(dist, world, options, batch: int) -> list:
    """A model with Dropout trained with fit_callbacks(); then the masks each rank draws for
    the same input, and the weights (the same on every rank)."""
    import tensorflow as tf
    tf.keras.utils.set_random_seed(3)  # the same seed on every rank, as users (and hvdtrain) do
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(32),
                                 tf.keras.layers.Dropout(0.5), tf.keras.layers.Dense(CLASSES)])
    train(model, dist, world, options, batch, epochs=1)
    masks = model.layers[1](tf.ones((8, 32)), training=True).numpy() != 0
    return [masks.astype("float32"), *model.get_weights()]


def save_all(out: Path, rank: int, save: dict) -> None:
    for case, arrays in save.items():
        np.savez(out / f"{case}.rank{rank}.npz", *arrays)


def two_rank_checks(dist, rank: int) -> dict:
    """At 2 ranks: float32 and float16 gradients in one step (in one group per dtype, and in
    buckets), and a rank with no batch at all joining at once while its peer reduces its one
    batch."""
    import tensorflow as tf
    from hvdtrain.config import HorovodConfig
    reduce = tf.function(lambda *grads: dist.reduce_gradients(grads, HorovodConfig()))
    mixed = reduce(tf.constant([1.0 + rank], tf.float32), tf.constant([2.0 + 2 * rank], tf.float16))
    # In buckets of one gradient each, two gradients per dtype (the reducer's, both stacks).
    bucketed = tf.function(lambda *grads: dist.reduce_gradients(
        grads, HorovodConfig(bucket_mb=0.00001)))
    in_buckets = bucketed(tf.constant([1.0 + rank]), tf.constant([2.0 + 2 * rank], tf.float16),
                          tf.constant([3.0 + 3 * rank, 5.0]),
                          tf.constant([4.0 + 4 * rank], tf.float16))
    joined = reduce(tf.constant([4.0]))[0].numpy().tolist() if rank == 0 else None
    checks = {"mixed": [float(g.numpy()[0]) for g in mixed],
              "mixed_dtypes": [g.dtype.name for g in mixed],
              "mixed_buckets": [g.numpy().tolist() for g in in_buckets],
              "joined": joined, "last_to_join": dist.join()}
    checks.update(unequal_steps=refusal(lambda: unequal_steps(dist, rank)),
                  jit_compile=refusal(lambda: jit_compiled_fit(dist)))
    checks["buckets"] = {case: bucket_ops(dist, bucket_mb)
                         for case, bucket_mb in BUCKET_CASES.items()}
    if dist.keras_version().startswith("3."):
        checks.update(metric_checks(dist, rank))
    return checks


def bucket_ops(dist, bucket_mb: float) -> list[list]:
    """A traced step of bucket_model, its gradients reduced as the Keras 3 optimizer does: for
    each Horovod op, in the order they were made, the positions of the variables whose gradient
    it waits for (the gradient ops among its ancestors), with its type."""
    import tensorflow as tf
    from hvdtrain.config import HorovodConfig
    model = bucket_model()
    gradient_ops: list = []

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        grads = tape.gradient(loss, model.trainable_variables)
        gradient_ops[:] = [grad.op for grad in grads]
        return dist.reduce_gradients(grads, HorovodConfig(bucket_mb=bucket_mb))

    graph = tf.function(step).get_concrete_function(tf.TensorSpec((None, FEATURES))).graph
    return [[op.type, sorted(i for i, grad_op in enumerate(gradient_ops)
                             if grad_op in ancestors(op))]
            for op in graph.get_operations() if "Horovod" in op.type]


def ancestors(op) -> set:
    """Every op ``op`` waits for, through its inputs and control inputs."""
    seen: set = set()
    todo = [op]
    while todo:
        this = todo.pop()
        for parent in [tensor.op for tensor in this.inputs] + list(this.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def unequal_steps(dist, rank: int) -> None:
    """Shards of 33 and 32 rows at batch 8: 5 steps on rank 0, 4 on rank 1."""
    import tensorflow as tf
    model = no_input_model()
    model.compile(dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1)), jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rows = 33 - rank
    model.fit(np.ones((rows, FEATURES), "float32"), np.zeros(rows, "int64"), batch_size=8,
              verbose=0, callbacks=dist.fit_callbacks())


def wrapped_after_fit(dist) -> None:
    """Keras 3: fit, then the same optimizer made distributed, then fit again without compile:
    the train function traced by the first fit would never all-reduce. (With the consistency
    check on, fit's train function is made again, with the wrapped optimizer, and the same
    rows on every rank are refused: the refusal here guards the check-off path.)"""
    import tensorflow as tf
    model = no_input_model()
    optimizer = tf.keras.optimizers.SGD(0.1)
    model.compile(optimizer, jit_compile=False,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.ones((16, FEATURES), "float32"), np.zeros(16, "int64")
    model.fit(x, y, batch_size=8, verbose=0)
    dist.distributed_optimizer(optimizer)
    model.fit(x, y, batch_size=8, verbose=0,
              callbacks=dist.fit_callbacks(consistency_check=False))


def jit_compiled_fit(dist) -> None:
    import tensorflow as tf
    model = no_input_model()
    model.compile(dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1)), jit_compile=True,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(np.ones((16, FEATURES), "float32"), np.zeros(16, "int64"), batch_size=8,
              verbose=0, callbacks=dist.fit_callbacks())


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
        # horovod.bucket_mb and Adasum in fit: the reducer's, on both stacks.
        "bucket_mb_optimizer": refusal(lambda: dist.distributed_optimizer(
            tf.keras.optimizers.SGD(0.1), HorovodConfig(bucket_mb=1.0))),
        "bucket_mb_tape": refusal(lambda: dist.distributed_tape(
            tf.GradientTape(), HorovodConfig(bucket_mb=1.0))),
    }
    if dist.keras_version().startswith("3."):
        pi = tf.constant([3.14159265], tf.float32)
        checks["unscale"] = refusal(lambda: dist.unscale_gradients(
            tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1)), [pi]))
        checks["wrapped_after_fit"] = refusal(lambda: wrapped_after_fit(dist))
        checks["accumulation_steps"] = refusal(lambda: dist.distributed_optimizer(
            tf.keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), HorovodConfig()))
    return checks


if __name__ == "__main__":
    main()
