"""Launched by tests/multirank/test_binding.py: the library pattern (a user's own ``fit`` with
``dist.distributed_optimizer`` and ``dist.fit_callbacks()``) on several models in turn
(tests/binding_models.py), in ONE job, saving what every rank ends with and the checks of
tests/binding_checks.py; at 1 rank it is the replay at twice the batch."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from binding_checks import refusal_checks, single_rank_checks, two_rank_checks
from binding_models import (BUCKET_CASES, CLASSES, FEATURES, bucket_model, data,
                            dense_first_model, no_input_model, own_step_model)
# The CLI's --model binding_worker:dense_first_on_input (test_binding.py) finds it here.
from binding_models import dense_first_on_input  # noqa: F401
from hvdtrain.launch import rank_process  # TensorFlow loads in main(), through rank_process
from stack import keras3


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
    if keras3():
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


if __name__ == "__main__":
    main()
