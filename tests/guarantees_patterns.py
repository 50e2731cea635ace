"""What the guarantees cases share (tests/guarantees_registry.py registers them,
tests/guarantees_worker.py runs them): the data and each rank's rows of it; a user's script
through the library path, and the same script at 1 rank with a plain optimizer beside it
(``standard``, ``fit_pattern``, ``outcome``); the models, optimizers and fits that cases of
several modules use; and an error's first line, as the table records it.

Importing this module registers no case and loads no TensorFlow.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from guarantees_registry import (BATCH, CLASSES, FEATURES, RANKS, ROWS, SEED, STEPS, Context,
                                 Outcome)


@dataclass
class Trained:
    model: Any
    history: Any
    reference: list | None


# ---------------------------------------------------------------------------------------------
# Data: rank r's batch k is rows 16k + 8r .. 16k + 8r + 7 of the global batches

def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    return x, rng.integers(0, CLASSES, ROWS).astype("int64")


def rows(rank: int | None) -> np.ndarray:
    """Rank ``rank``'s rows, batch after batch; None: the global batches, in order."""
    index = np.arange(ROWS).reshape(STEPS, RANKS, BATCH)
    return index.ravel() if rank is None else index[:, rank].ravel()


def with_ids(x: np.ndarray) -> np.ndarray:
    """Column 0 a row's own id (for an embedding): no id twice in a batch."""
    x = x.copy()
    x[:, 0] = np.arange(len(x))
    return x


def loss(tf):
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def sgd(tf, **kwargs):
    return tf.keras.optimizers.SGD(0.1, momentum=0.5, **kwargs)


def largest(a: list, b: list) -> float:
    if [np.shape(x) for x in a] != [np.shape(y) for y in b]:
        return float("inf")
    return max((float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                for x, y in zip(a, b) if np.size(x)), default=0.0)


# ---------------------------------------------------------------------------------------------
# The library path, and the reference beside it

def standard(build: Callable, *, optimizer: Callable | None = None, options: Any = None,
             wrap: bool = True) -> Callable:
    """The usual setup: ``build(ctx, role)``'s model and a fresh optimizer, wrapped by
    ``dist.distributed_optimizer`` on the ranks (unless ``wrap`` is off), plain for the
    reference."""
    def setup(ctx: Context, role: str):
        model = build(ctx, role)
        opt = (optimizer or (lambda: sgd(ctx.tf)))()
        if role == "rank" and wrap:
            opt = ctx.dist.distributed_optimizer(opt, options)
        return model, opt
    return setup


def fit_pattern(ctx: Context, setup: Callable, *, x: np.ndarray | None = None,
                compile_kw: dict | None = None, fit_kw: Callable | None = None,
                shard: Callable | None = None, reference: bool = True,
                check: bool = True, callbacks: Callable[[], list] | None = None) -> Trained:
    """The user's script on this rank: seeded 100 + rank, ``setup(ctx, "rank")``'s model and
    optimizer compiled, fit on this rank's shard at batch B with ``dist.fit_callbacks()``
    (its consistency check off where ``check`` is; ``callbacks()`` instead, where given), one
    epoch unless ``fit_kw(rank)`` says
    otherwise, its callbacks after those. Then, if ``reference``, the same script at 1 rank:
    seeded as rank 0, ``setup(ctx, "reference")``, fit at batch 2B on the global batches, no
    hvdtrain callback."""
    tf = ctx.tf
    xs, ys = data()
    xs = xs if x is None else x
    fit_kw = fit_kw or (lambda rank: {})

    def train(role: str) -> tuple[Any, Any]:
        rank = ctx.rank if role == "rank" else None
        tf.keras.utils.set_random_seed(SEED + (ctx.rank if role == "rank" else 0))
        model, opt = setup(ctx, role)
        model.compile(optimizer=opt, loss=loss(tf), **{"jit_compile": False, **(compile_kw or {})})
        picked = shard(rank) if shard else rows(rank)
        own = ((callbacks or (lambda: ctx.dist.fit_callbacks(consistency_check=check)))()
               if role == "rank" else [])
        kw = {"epochs": 1, "shuffle": False, **fit_kw(rank)}
        kw["callbacks"] = own + kw.get("callbacks", [])
        history = model.fit(xs[picked], ys[picked], batch_size=BATCH * (1 if rank is not None
                                                                         else ctx.size),
                            verbose=0, **kw)
        return model, history

    model, history = train("rank")
    ref = train("reference")[0].get_weights() if reference else None
    return Trained(model, history, ref)


def outcome(trained: Trained, **checks: Any) -> Outcome:
    return Outcome(trained.model.get_weights(), trained.reference, dict(checks))


def mlp(ctx: Context, role: str, *, input_layer: bool = True):
    tf = ctx.tf
    layers = [tf.keras.layers.Dense(16, activation="tanh"), tf.keras.layers.Dense(CLASSES)]
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)), *layers] if input_layer else layers)


# ---------------------------------------------------------------------------------------------
# Models, optimizers and fits that cases of several modules use

def subclassed_class(tf):
    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = tf.keras.layers.Dense(16, activation="tanh")
            self.out = tf.keras.layers.Dense(CLASSES)

        def call(self, x):
            return self.out(self.hidden(x))

    return Net


def own_step_model(ctx: Context, role: str, *, tape_options: Any = None, two_optimizers=False):
    """A subclassed model with its own train_step (tape, then apply_gradients). With
    ``tape_options`` the ranks' tape is dist.distributed_tape (the optimizer then stays plain);
    with ``two_optimizers`` a GAN-style step: the first half of the model trained by the
    compiled optimizer, the second half by a second one (distributed on the ranks)."""
    tf = ctx.tf
    dist = ctx.dist
    reduce = role == "rank" and tape_options is not None
    second = None
    if two_optimizers:
        second = sgd(tf)
        if role == "rank":
            second = dist.distributed_optimizer(second)

    class OwnStep(subclassed_class(tf)):
        def __init__(self):
            super().__init__()
            self.loss_fn = loss(tf)
            self.second_optimizer = second

        def gradients(self, x, y, part):
            with tf.GradientTape() as tape:
                value = self.loss_fn(y, self(x, training=True))
            if reduce:
                tape = dist.distributed_tape(tape, tape_options)
            variables = part.trainable_variables   # built by the call above
            return value, tape.gradient(value, variables), variables

        def train_step(self, batch):
            x, y = batch
            if self.second_optimizer is None:
                value, grads, variables = self.gradients(x, y, self)
                self.optimizer.apply_gradients(zip(grads, variables))
                return {"loss": value}
            value, grads, variables = self.gradients(x, y, self.hidden)
            self.optimizer.apply_gradients(zip(grads, variables))
            value, grads, variables = self.gradients(x, y, self.out)
            self.second_optimizer.apply_gradients(zip(grads, variables))
            return {"loss": value}

    return OwnStep()


def embedding_model(ctx: Context, role: str, *, dense_first: bool):
    """Column 0 is the row's id, looked up in an Embedding (a sparse gradient), the other
    columns go through a Dense layer; ``dense_first`` creates the Dense layer first, so that
    its dense gradients come before the sparse one."""
    tf = ctx.tf

    class Mixed(tf.keras.Model):
        def __init__(self):
            super().__init__()
            if dense_first:
                self.dense = tf.keras.layers.Dense(CLASSES)
            self.embed = tf.keras.layers.Embedding(ROWS, 8)
            if not dense_first:
                self.dense = tf.keras.layers.Dense(CLASSES)

        def call(self, x):
            ids = tf.cast(x[:, 0], tf.int32)
            return self.dense(tf.concat([x[:, 1:], self.embed(ids)], axis=1))

    return Mixed()


def batch_norm_model(ctx: Context, role: str, norm: Any = None):
    tf = ctx.tf
    norm = norm or tf.keras.layers.BatchNormalization
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(16),
                                norm(), tf.keras.layers.Activation("relu"),
                                tf.keras.layers.Dense(CLASSES)])


def dropout_model(ctx: Context, role: str):
    tf = ctx.tf
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                tf.keras.layers.Dense(16, activation="tanh"),
                                tf.keras.layers.Dropout(0.5, name="drop"),
                                tf.keras.layers.Dense(CLASSES)])


def adam(tf):
    return tf.keras.optimizers.Adam(0.01)


def trained_elsewhere(ctx: Context):
    """A model and Adam trained 2 steps by a plain fit (no hvdtrain): a state to restore."""
    tf = ctx.tf
    tf.keras.utils.set_random_seed(7)
    model = mlp(ctx, "saved")
    model.compile(optimizer=adam(tf), loss=loss(tf), jit_compile=False)
    x, y = data()
    model.fit(x[:2 * BATCH], y[:2 * BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model


def seeded_alike_fit(ctx: Context, build: Callable, data_set: Any = None,
                     callbacks_kw: dict | None = None, **compile_kw: Any) -> Any:
    """A user's script seeded alike on every rank (tf.keras.utils.set_random_seed(SEED)),
    ``build(ctx, "rank")`` compiled (with ``compile_kw``) and fit for an epoch with
    ``dist.fit_callbacks(**callbacks_kw)`` on this rank's rows (or ``data_set``)."""
    tf = ctx.tf
    tf.keras.utils.set_random_seed(SEED)
    model, opt = standard(build)(ctx, "rank")
    model.compile(optimizer=opt, loss=loss(tf), jit_compile=False, **compile_kw)
    xs, ys = data()
    given = (data_set,) if data_set is not None else (xs[rows(ctx.rank)], ys[rows(ctx.rank)])
    model.fit(*given, **({} if data_set is not None else {"batch_size": BATCH}), epochs=1,
              verbose=0, shuffle=False, callbacks=ctx.dist.fit_callbacks(**(callbacks_kw or {})))
    return model


def first_line(error: BaseException) -> str:
    """The exception's type and the first line that says what went wrong: TensorFlow's errors
    open with "Graph execution error:" and the Python stack of the node, then the message."""
    lines = [line for line in str(error).splitlines() if line.strip()
             and not line[0].isspace() and not line.startswith(("Graph execution error",
                                                                  "Detected at node",
                                                                  "<stack traces"))]
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", lines[0] if lines else "")
    return f"{type(error).__name__}: {text[:200]}"
