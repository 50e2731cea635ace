"""The checks tests/binding_worker.py's ranks record in checks.rankR.json, beside the weights
of its cases: on every rank the binding's one-line refusals and an optimizer's state kept by
the wrapper; at 1 rank the reducer's pass-through; at 2 ranks gradients of two dtypes and in
buckets, a rank joining at once, the ops of each bucket, unequal steps and jit_compile refused,
and Keras 3's metric averaging."""
from __future__ import annotations

import numpy as np

from binding_models import (BUCKET_CASES, FEATURES, bucket_model, data, dense_first_model,
                            no_input_model)
from guarantees_apart import skipping_model
from stack import keras3


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
    if keras3():
        checks.update(metric_checks(dist, rank))
    # Last, as they would hang if they failed: a layer skipped on rank 1, at one all-reduce
    # (flat, and grouped with flatten off) and in buckets (at 0.0005 MB one flat bucket, one
    # grouped, one whole; at 0.00001 all grouped); an Embedding skipped (its gradient sparse);
    # on Keras 3 a layer skipped under Keras' own accumulation; through the tape. And a step
    # traced again on one rank only.
    checks["skipped_layer"] = [refusal(lambda: skipped_layer_fit(dist, rank, options))
                               for options in (HorovodConfig(bucket_mb=0),
                                               HorovodConfig(bucket_mb=0, flatten=False),
                                               HorovodConfig(bucket_mb=0.00001),
                                               HorovodConfig(bucket_mb=0.0005))]
    checks["skipped_embedding"] = [
        refusal(lambda: skipped_layer_fit(dist, rank, options, embedding=True))
        for options in (HorovodConfig(bucket_mb=0), HorovodConfig(bucket_mb=0.0005))]
    if keras3():
        checks["skipped_layer"].append(refusal(lambda: skipped_layer_fit(
            dist, rank, HorovodConfig(bucket_mb=0.0005), accumulation=2)))
    checks["skipped_on_tape"] = skipped_layer_tape(dist, rank)
    checks["retraced_alone"] = retraced_on_one_rank(dist, rank)
    return checks


def skipped_layer_fit(dist, rank: int, options, embedding: bool = False,
                      accumulation: int = 1) -> None:
    """docs/guarantees.md's layer_skipped_on_rank through the library: a model that skips its
    middle Dense (or, with ``embedding``, dense_first_model's Embedding, whose gradient is
    sparse) on rank 1, fit with a distributed optimizer of ``options`` (accumulating over
    ``accumulation`` batches with Keras 3's own gradient_accumulation_steps)."""
    from types import SimpleNamespace

    import tensorflow as tf
    model = dense_first_model() if embedding else skipping_model(SimpleNamespace(tf=tf))
    x, y = data(rank, 2, 8)
    model(x[:1])
    model.skip = rank == 1
    own = {"gradient_accumulation_steps": accumulation} if accumulation > 1 else {}
    model.compile(optimizer=dist.distributed_optimizer(tf.keras.optimizers.SGD(0.1, **own),
                                                       options),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=dist.fit_callbacks())


def skipped_layer_tape(dist, rank: int) -> str:
    """The error of a traced step of a loop of one's own whose model skips its Embedding on
    rank 1, its gradients taken through dist.distributed_tape ("": none)."""
    import tensorflow as tf
    model, optimizer = dense_first_model(), tf.keras.optimizers.SGD(0.1)
    x, y = data(rank, 2, 8)
    model(x[:1])
    model.skip = rank == 1

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)
        grads = dist.distributed_tape(tape).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients((g, v) for g, v in zip(grads, model.trainable_variables)
                                  if g is not None)
    try:
        step(x[:8], y[:8])
    except tf.errors.InvalidArgumentError as e:
        return str(e)
    return ""


def retraced_on_one_rank(dist, rank: int) -> list[list[float]]:
    """Two traced steps of a loop of one's own, the gradient through dist.distributed_tape:
    the first of 2 rows on both ranks, the second of 1 row on rank 0 (a trace of its own
    there) and of 2 on rank 1; each step's gradient."""
    import tensorflow as tf
    weight = tf.Variable([1.0])

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(x * weight)
        return dist.distributed_tape(tape).gradient(loss, [weight])[0]
    first = step(tf.fill([2], rank + 1.0))
    second = step(tf.ones([1 if rank == 0 else 2]))
    return [first.numpy().tolist(), second.numpy().tolist()]


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
    if keras3():
        pi = tf.constant([3.14159265], tf.float32)
        checks["unscale"] = refusal(lambda: dist.unscale_gradients(
            tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1)), [pi]))
        checks["wrapped_after_fit"] = refusal(lambda: wrapped_after_fit(dist))
        checks["accumulation_steps"] = refusal(lambda: dist.distributed_optimizer(
            tf.keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), HorovodConfig()))
    return checks
