"""Launched by tests/guarantees_table.py (``make guarantees``, tests/multirank/test_guarantees.py):
a matrix of Keras usage patterns, each a small case written as a user's own script would be,
through the library path (``from hvdtrain import distributed as dist``: ``dist.init()``,
``dist.distributed_optimizer``, ``dist.fit_callbacks()``, ``model.fit`` or an own
``train_step``), all in ONE job of 2 ranks.

For each case every rank records, in ``OUT/rankR.json`` (written after every case, so a hang
loses nothing before it): how the case ended (``done``, ``refused`` with the one line of
hvdtrain's UserError, ``not offered``, ``error`` with the exception's type and first line,
``hang`` when Horovod's stall check shut the job's collectives down); the largest difference
between its final weights (BatchNormalization's moving statistics included) and rank 0's,
gathered over the ranks; and, where the case's contract is "as 1 rank at twice the batch", the
largest difference to a reference this rank trains itself with a PLAIN optimizer (no hvdtrain)
on the global batches (batch k of rank 0 followed by batch k of rank 1) from rank 0's initial
weights. Rank 0 prints ``case NAME start`` before each case: a hang shows which case it is.

The cases are registered in order (``CASES``): the ones that may hang, or shut Horovod down,
come last; a case that hangs ends the job, and tests/guarantees_table.py starts another for the
cases after it. Importing this module loads no TensorFlow: the table reads ``CASES`` (names,
titles, contracts, notes) from it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hvdtrain.launch import rank_process  # TensorFlow loads in main(), through rank_process

if __name__ == "__main__":  # one module, whose CASES tests/horovod_api_cases.py adds to
    sys.modules.setdefault("guarantees_worker", sys.modules["__main__"])

FEATURES, CLASSES, BATCH, STEPS, RANKS = 16, 4, 8, 4, 2
ROWS = STEPS * RANKS * BATCH           # 64 rows: 4 global batches of 16
SEED = 100                             # rank r seeds 100 + r: only the broadcast makes them agree
# How long a collective may wait for a rank before Horovod's stall check shuts the job's
# collectives down: a hang costs this, and a rank may lag its peer by less (the cases keep the
# ranks' work alike: every rank trains the reference too).
STALL_WARNING_S, STALL_ABORT_S = 10, 30

EXACT = "= 1 rank at 2B"    # the contract: 2 ranks x B end as 1 rank x 2B on the same batches
NONE = "none"               # no such contract (the note says why); the ranks must agree


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    contract: str          # EXACT or NONE
    note: str              # what the case does and what hvdtrain promises for it
    run: Callable[["Context"], "Outcome"]
    family: str = "library"   # "horovod": Horovod's API (docs/horovod-api.md)


CASES: list[Case] = []


def case(name: str, title: str, contract: str, note: str, family: str = "library"):
    def register(run: Callable[["Context"], "Outcome"]) -> Callable[["Context"], "Outcome"]:
        CASES.append(Case(name, title, contract, " ".join(note.split()), run, family))
        return run
    return register


class NotOffered(Exception):
    """The pattern does not exist on this stack (an argument its Keras lacks, a layer hvdtrain
    does not offer)."""


@dataclass
class Context:
    tf: Any
    dist: Any
    rank: int
    size: int
    out: Path


@dataclass
class Outcome:
    state: list            # this rank's final weights (get_weights: trainable and not)
    reference: list | None = None    # the reference's final weights, where the contract is EXACT
    checks: dict = field(default_factory=dict)   # description -> [holds, detail]


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


def keras3(ctx: Context) -> bool:
    return ctx.dist.keras_version().startswith("3.")


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
# The cases, in the order they run

@case("control_plain_optimizer", "control: a plain optimizer, not wrapped, check off", NONE,
      """The harness's control: dist.fit_callbacks(consistency_check=False) and an optimizer
      left plain, so the gradients are never all-reduced. The ranks start alike and must end
      apart: the check across ranks is sharp.""")
def control_plain_optimizer(ctx):
    return outcome(fit_pattern(ctx, standard(mlp, wrap=False), reference=False, check=False))


@case("sequential_input", "`Sequential` with `Input`", EXACT,
      """Two Dense layers on an Input, SGD with momentum, model.fit with dist.fit_callbacks():
      rank 0's weights and optimizer state broadcast, gradients averaged every step.""")
def sequential_input(ctx):
    return outcome(fit_pattern(ctx, standard(mlp)))


@case("sequential_no_input", "`Sequential` without `Input`", EXACT,
      """The same model without an Input: it has no weights until fit builds it, so the
      broadcast has to wait for the build and still come before the first step.""")
def sequential_no_input(ctx):
    return outcome(fit_pattern(ctx, standard(lambda c, r: mlp(c, r, input_layer=False))))


def subclassed_class(tf):
    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = tf.keras.layers.Dense(16, activation="tanh")
            self.out = tf.keras.layers.Dense(CLASSES)

        def call(self, x):
            return self.out(self.hidden(x))

    return Net


def subclassed_mlp(ctx: Context, role: str):
    return subclassed_class(ctx.tf)()


@case("subclassed", "subclassed `Model`", EXACT,
      """A tf.keras.Model subclass with its own call(), never built before fit.""")
def subclassed(ctx):
    return outcome(fit_pattern(ctx, standard(subclassed_mlp)))


@case("shared_layers", "shared layer (one Dense applied twice)", EXACT,
      """A functional model that applies one Dense layer twice: its gradient is the sum of
      both uses, reduced once.""")
def shared_layers(ctx):
    def build(ctx, role):
        tf = ctx.tf
        inputs = tf.keras.Input((FEATURES,))
        shared = tf.keras.layers.Dense(FEATURES, activation="tanh")
        return tf.keras.Model(inputs, tf.keras.layers.Dense(CLASSES)(shared(shared(inputs))))
    return outcome(fit_pattern(ctx, standard(build)))


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


@case("own_train_step", "own `train_step` (tape + `apply_gradients`)", EXACT,
      """A subclassed model whose train_step takes a GradientTape's gradients and calls
      self.optimizer.apply_gradients, the optimizer from dist.distributed_optimizer.""")
def own_train_step(ctx):
    return outcome(fit_pattern(ctx, standard(own_step_model)))


@case("own_train_step_tape", "own `train_step` with `dist.distributed_tape`", EXACT,
      """The same train_step with its tape wrapped by dist.distributed_tape and a plain
      optimizer: the tape returns the averaged gradients.""")
def own_train_step_tape(ctx):
    from hvdtrain.config import HorovodConfig
    return outcome(fit_pattern(ctx, standard(
        lambda c, r: own_step_model(c, r, tape_options=HorovodConfig()), wrap=False)))


@case("two_optimizers", "two optimizers in one step (GAN-style)", EXACT,
      """An own train_step that updates the first layer with the compiled optimizer and the
      second with another one, both from dist.distributed_optimizer.""")
def two_optimizers(ctx):
    return outcome(fit_pattern(ctx, standard(
        lambda c, r: own_step_model(c, r, two_optimizers=True))))


@case("clipnorm", "`clipnorm`", EXACT,
      """SGD(clipnorm=0.05), small enough to clip every step: clipping the averaged gradient
      is what 1 rank at 2B does; clipping each rank's own would not be.""")
def clipnorm(ctx):
    return outcome(fit_pattern(ctx, standard(mlp, optimizer=lambda: sgd(ctx.tf, clipnorm=0.05))))


@case("global_clipnorm", "`global_clipnorm`", EXACT,
      """SGD(global_clipnorm=0.05), clipping every step, as above for the global norm.""")
def global_clipnorm(ctx):
    return outcome(fit_pattern(ctx, standard(
        mlp, optimizer=lambda: sgd(ctx.tf, global_clipnorm=0.05))))


@case("lr_schedule", "learning-rate schedule object", EXACT,
      """SGD on an ExponentialDecay schedule (halved every step): the schedule reads the
      optimizer's step count, which the ranks share.""")
def lr_schedule(ctx):
    tf = ctx.tf

    def optimizer():
        schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=1,
                                                                  decay_rate=0.5)
        return tf.keras.optimizers.SGD(schedule, momentum=0.5)
    return outcome(fit_pattern(ctx, standard(mlp, optimizer=optimizer)))


@case("class_weight", "`class_weight`", EXACT,
      """fit(class_weight=...) with unequal weights: the loss is a mean over the batch
      (weighted sum / batch size), so the mean of the ranks' means is the global one.""")
def class_weight(ctx):
    weights = {0: 1.0, 1: 2.0, 2: 0.5, 3: 1.5}
    return outcome(fit_pattern(ctx, standard(mlp), fit_kw=lambda rank: {"class_weight": weights}))


@case("sample_weight", "`sample_weight`", EXACT,
      """fit(sample_weight=...), each rank the weights of its own rows.""")
def sample_weight(ctx):
    weights = np.random.default_rng(3).uniform(0.5, 2.0, ROWS).astype("float32")
    return outcome(fit_pattern(ctx, standard(mlp), fit_kw=lambda rank: {
        "sample_weight": weights[rows(rank)]}))


@case("steps_per_execution", "`steps_per_execution=2`", EXACT,
      """compile(steps_per_execution=2): two steps per call of the train function, so
      callbacks see every second batch.""")
def steps_per_execution(ctx):
    return outcome(fit_pattern(ctx, standard(mlp), compile_kw={"steps_per_execution": 2}))


@case("validation_data", "`validation_data`", EXACT,
      """fit(validation_data=...), each rank scoring its own half of 32 held-out rows; the
      epoch's val_loss must be the same number on every rank (averaged).""")
def validation_data(ctx):
    rng = np.random.default_rng(11)
    xv = rng.normal(size=(32, FEATURES)).astype("float32")
    yv = rng.integers(0, CLASSES, 32)
    half = lambda rank: slice(None) if rank is None else slice(16 * rank, 16 * rank + 16)
    trained = fit_pattern(ctx, standard(mlp), fit_kw=lambda rank: {
        "validation_data": (xv[half(rank)], yv[half(rank)])})
    everyone = ctx.dist.allgather_object(trained.history.history.get("val_loss"))
    alike = everyone[0] is not None and all(v == everyone[0] for v in everyone)
    return outcome(trained, **{"val_loss the same on every rank": [alike, repr(everyone)]})


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


@case("embedding_first", "sparse gradient (Embedding) before dense ones", EXACT,
      """A subclassed model whose Embedding is created before its Dense layer: the embedding's
      gradient (IndexedSlices) comes first.""")
def embedding_first(ctx):
    return outcome(fit_pattern(ctx, standard(
        lambda c, r: embedding_model(c, r, dense_first=False)), x=with_ids(data()[0])))


@case("embedding_after_dense", "sparse gradient (Embedding) after dense ones", EXACT,
      """The same with the Dense layer created first: dense gradients, then the sparse one.""")
def embedding_after_dense(ctx):
    return outcome(fit_pattern(ctx, standard(
        lambda c, r: embedding_model(c, r, dense_first=True)), x=with_ids(data()[0])))


def batch_norm_model(ctx: Context, role: str, norm: Any = None):
    tf = ctx.tf
    norm = norm or tf.keras.layers.BatchNormalization
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(16),
                                norm(), tf.keras.layers.Activation("relu"),
                                tf.keras.layers.Dense(CLASSES)])


@case("batch_norm", "`BatchNormalization` (default)", NONE,
      """Dense, BatchNormalization, Dense. Each rank normalizes its own batch of B, so 1 rank
      at 2B is not the contract; the moving mean and variance (compared with the weights)
      must end the same on every rank, or the ranks' models give different outputs.""")
def batch_norm(ctx):
    return outcome(fit_pattern(ctx, standard(batch_norm_model), reference=False))


@case("sync_batch_norm", "`dist.SyncBatchNormalization`", EXACT,
      """The same model with dist.SyncBatchNormalization: the batch moments all-reduced over
      the ranks, so 2 ranks at B normalize as 1 rank at 2B with Keras' BatchNormalization
      (the reference), moving statistics included.""")
def sync_batch_norm(ctx):
    sync = getattr(ctx.dist, "SyncBatchNormalization", None)
    if sync is None:
        raise NotOffered("hvdtrain.distributed has no SyncBatchNormalization")
    return outcome(fit_pattern(ctx, standard(
        lambda c, r: batch_norm_model(c, r, sync if r == "rank" else None))))


def dropout_model(ctx: Context, role: str):
    tf = ctx.tf
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                tf.keras.layers.Dense(16, activation="tanh"),
                                tf.keras.layers.Dropout(0.5, name="drop"),
                                tf.keras.layers.Dense(CLASSES)])


@case("dropout", "`Dropout`", NONE,
      """Dense, Dropout(0.5), Dense. Each rank must draw its own masks (else the global batch
      has B distinct masks, not 2B), so 1 rank at 2B is not the contract; the weights must
      still agree, and the same seeds must give the same run again. The masks: the Dropout
      layer's mask on the same input, drawn on each rank after training.""")
def dropout(ctx):
    tf = ctx.tf

    def run():
        trained = fit_pattern(ctx, standard(dropout_model), reference=False)
        mask = trained.model.get_layer("drop")(tf.ones((BATCH, 16)), training=True).numpy() != 0
        return trained, mask

    trained, mask = run()
    masks = ctx.dist.allgather_object(mask)
    differ = float(np.mean(masks[0] != masks[1]))
    tf.keras.backend.clear_session()
    again, _ = run()
    rerun = largest(trained.model.get_weights(), again.model.get_weights())
    return outcome(trained, **{
        "masks differ across ranks": [differ > 0, f"{differ:.0%} of mask entries differ"],
        "the same seeds reproduce the run": [rerun == 0, f"largest difference {rerun:.1e}"]})


@case("fp16_compression", "fp16 compression", NONE,
      """HorovodConfig(compression="fp16"): gradients cast to float16 for the all-reduce,
      about 3 significant digits, so close to 1 rank at 2B, not equal (the difference is
      shown); the ranks must agree.""")
def fp16_compression(ctx):
    from hvdtrain.config import HorovodConfig
    trained = fit_pattern(ctx, standard(mlp, options=HorovodConfig(compression="fp16")))
    return outcome(trained)


@case("adasum_fit", "Adasum, `distributed_optimizer` in `fit`", NONE,
      """HorovodConfig(op="adasum") given to dist.distributed_optimizer: Adasum combines the
      gradients by their directions, not an average, so there is no 1 rank at 2B to equal;
      the ranks must agree.""")
def adasum_fit(ctx):
    from hvdtrain.config import HorovodConfig
    return outcome(fit_pattern(ctx, standard(mlp, options=HorovodConfig(op="adasum")),
                               reference=False))


@case("adasum_tape", "Adasum, `dist.distributed_tape` in an own `train_step`", NONE,
      """The own train_step with dist.distributed_tape(tape, HorovodConfig(op="adasum")) and
      a plain optimizer; as above, the ranks must agree.""")
def adasum_tape(ctx):
    from hvdtrain.config import HorovodConfig
    return outcome(fit_pattern(ctx, standard(
        lambda c, r: own_step_model(c, r, tape_options=HorovodConfig(op="adasum")),
        wrap=False), reference=False))


@case("mixed_float16_before", "`mixed_float16` set before wrapping", NONE,
      """The mixed_float16 policy set before dist.distributed_optimizer and the model: float16
      sums a batch of 2B in another order than two of B, so close to 1 rank at 2B, not equal
      (the difference is shown); the ranks must agree.""")
def mixed_float16_before(ctx):
    ctx.tf.keras.mixed_precision.set_global_policy("mixed_float16")
    return outcome(fit_pattern(ctx, standard(mlp)))


@case("restore_load_weights", "`load_weights` on rank 0 only", EXACT,
      """Rank 0 loads saved weights into its model before fit; the other ranks do not. The
      restored weights must reach every rank before the first step: the reference is 1 rank
      at 2B from the restored weights.""")
def restore_load_weights(ctx):
    tf = ctx.tf
    path = ctx.out / f"restore-rank{ctx.rank}.weights.h5"   # the same file on every rank
    tf.keras.utils.set_random_seed(7)
    mlp(ctx, "saved").save_weights(str(path))

    def build(ctx, role):
        model = mlp(ctx, role)
        if role == "reference" or ctx.rank == 0:
            model.load_weights(str(path))
        return model
    return outcome(fit_pattern(ctx, standard(build)))


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


@case("restore_checkpoint", "`tf.train.Checkpoint` restored on rank 0 only", EXACT,
      """Model and Adam state (step count, moments) written by tf.train.Checkpoint after 2
      steps; rank 0 alone builds its optimizer and reads the checkpoint before fit. The
      reference: 1 rank at 2B from the same restored state.""")
def restore_checkpoint(ctx):
    tf = ctx.tf
    saved = trained_elsewhere(ctx)
    prefix = str(ctx.out / f"restore-rank{ctx.rank}-ckpt")
    tf.train.Checkpoint(model=saved, optimizer=saved.optimizer).write(prefix)

    def setup(ctx, role):
        model, opt = mlp(ctx, role), adam(tf)
        if role == "rank":
            opt = ctx.dist.distributed_optimizer(opt)
        if role == "reference" or ctx.rank == 0:
            opt.build(model.trainable_variables)
            tf.train.Checkpoint(model=model, optimizer=opt).read(prefix).expect_partial()
        return model, opt
    return outcome(fit_pattern(ctx, setup))


@case("grad_accumulation_optimizer", "Keras `gradient_accumulation_steps`", EXACT,
      """An optimizer built with gradient_accumulation_steps=2 (Keras 3's own accumulation)
      given to dist.distributed_optimizer; the reference accumulates the same way at 2B.""")
def grad_accumulation_optimizer(ctx):
    if not keras3(ctx):
        raise NotOffered("Keras 2's optimizers have no gradient_accumulation_steps")
    return outcome(fit_pattern(ctx, standard(
        mlp, optimizer=lambda: sgd(ctx.tf, gradient_accumulation_steps=2))))


@case("backward_passes_per_step", "Horovod's `backward_passes_per_step=2`", EXACT,
      """HorovodConfig(backward_passes_per_step=2) given to dist.distributed_optimizer for fit
      (Horovod's own accumulation); the reference: an update every 2 batches of 2B.""")
def backward_passes_per_step(ctx):
    from hvdtrain.config import HorovodConfig
    tf = ctx.tf
    return outcome(fit_pattern(ctx, standard(
        mlp, options=HorovodConfig(backward_passes_per_step=2),
        optimizer=lambda: sgd(tf, **({"gradient_accumulation_steps": 2} if keras3(ctx)
                                     else {})))))


@case("mixed_float16_after", "`mixed_float16` set after wrapping", NONE,
      """dist.distributed_optimizer under float32, then the mixed_float16 policy, then the
      model and compile, which puts a loss scale optimizer around the distributed one (its
      inf/NaN check would then see each rank's own gradients); as mixed_float16 above, 1 rank
      at 2B is close, not equal.""")
def mixed_float16_after(ctx):
    tf = ctx.tf

    def setup(ctx, role):
        opt = sgd(tf)
        if role == "rank":
            opt = ctx.dist.distributed_optimizer(opt)
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        return mlp(ctx, role), opt
    return outcome(fit_pattern(ctx, setup))


@case("jit_compile", "`jit_compile=True`", EXACT,
      """compile(jit_compile=True): XLA, which has no lowering of Horovod's all-reduce.""")
def jit_compile(ctx):
    return outcome(fit_pattern(ctx, standard(mlp), compile_kw={"jit_compile": True}))


@case("restore_load_model", "`load_model` on rank 0 only, its optimizer resumed", EXACT,
      """Rank 0 loads a saved model.keras (compiled, Adam's state inside) and compiles it with
      dist.distributed_optimizer(model.optimizer); the other ranks build the same model with
      a fresh Adam. The reference: the loaded model and its optimizer at 1 rank x 2B.""")
def restore_load_model(ctx):
    tf = ctx.tf
    path = ctx.out / f"restore-rank{ctx.rank}.keras"
    trained_elsewhere(ctx).save(str(path))

    def setup(ctx, role):
        if role == "reference":
            model = tf.keras.models.load_model(str(path))
            return model, model.optimizer
        if ctx.rank == 0:
            model = tf.keras.models.load_model(str(path))
            return model, ctx.dist.distributed_optimizer(model.optimizer)
        return mlp(ctx, role), ctx.dist.distributed_optimizer(adam(tf))
    return outcome(fit_pattern(ctx, setup))


@case("extra_model_on_rank0", "rank 0 builds and drops another model first", EXACT,
      """Rank 0 builds a model (to print a summary, say) and drops it before building the real
      one: Keras numbers layer names per process, so the ranks' variable names differ.""")
def extra_model_on_rank0(ctx):
    def build(ctx, role):
        if role == "reference" or ctx.rank == 0:
            mlp(ctx, "summary").summary(print_fn=lambda *args, **kwargs: None)
        return mlp(ctx, role)
    return outcome(fit_pattern(ctx, standard(build)))


# ---------------------------------------------------------------------------------------------
# Divergence from outside the listed patterns: the consistency check stops it in one line

def on_rank(ctx: Context, rank: int, act: Callable, *, at: str = "epoch_end") -> Any:
    """A callback that runs ``act(model)`` on ``rank`` alone: at each epoch's end, or after
    the second batch of each epoch (``at="batch"``), as a user's callback under
    ``if rank == 0`` does."""
    tf = ctx.tf

    class OnOneRank(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if at == "epoch_end" and ctx.rank == rank:
                act(self.model)

        def on_train_batch_end(self, batch, logs=None):
            if at == "batch" and batch == 1 and ctx.rank == rank:
                act(self.model)
    return OnOneRank()


def two_epochs(callbacks: Callable[[int | None], list]) -> Callable:
    return lambda rank: {"epochs": 2, "callbacks": callbacks(rank) if rank is not None else []}


@case("compile_plain_string", "`compile(optimizer=\"adam\")`, never wrapped", NONE,
      """compile with the optimizer's name, as single-process scripts do, and
      dist.fit_callbacks(): each rank would train on its own gradients. hvdtrain refuses it
      before the first step, naming the call to make.""")
def compile_plain_string(ctx):
    def setup(ctx, role):
        return mlp(ctx, role), "adam"
    return outcome(fit_pattern(ctx, setup, reference=False))


@case("arrays_not_sharded", "the same arrays on every rank, not sharded", NONE,
      """Every rank fits the whole arrays (shuffled, seeded per rank): the ranks repeat each
      other's work, twice the steps per epoch. The check compares what samples the ranks
      trained on in the first epoch and stops, naming dist.shard(x, y).""")
def arrays_not_sharded(ctx):
    return outcome(fit_pattern(ctx, standard(mlp), shard=lambda rank: rows(None),
                               fit_kw=lambda rank: {"shuffle": True}, reference=False))


@case("lr_callback_rank0", "learning rate changed by a callback on rank 0 only", NONE,
      """A callback under `if rank == 0` lowers the learning rate at the end of epoch 1
      (as ReduceLROnPlateau does): before epoch 2's first step every rank takes rank 0's
      rate (rank 0 prints one line saying so), so the ranks agree.""")
def lr_callback_rank0(ctx):
    lower = on_rank(ctx, 0, lambda model: model.optimizer.learning_rate.assign(0.01))
    trained = fit_pattern(ctx, standard(mlp), fit_kw=two_epochs(lambda rank: [lower]),
                          reference=False)
    rate = float(np.asarray(trained.model.optimizer.learning_rate))
    return outcome(trained, **{"every rank took rank 0's learning rate": [
        abs(rate - 0.01) < 1e-9, f"{rate:g}"]})


@case("lr_assign_mid_epoch_rank0", "learning rate assigned mid-epoch on rank 0 only", NONE,
      """optimizer.learning_rate.assign(...) on rank 0 alone after a batch: the ranks train
      the rest of the epoch with different rates. At the epoch's end every rank stops, naming
      learning_rate.""")
def lr_assign_mid_epoch_rank0(ctx):
    lower = on_rank(ctx, 0, lambda model: model.optimizer.learning_rate.assign(0.01),
                    at="batch")
    return outcome(fit_pattern(ctx, standard(mlp), fit_kw=two_epochs(lambda rank: [lower]),
                               reference=False))


def nudge(model: Any) -> None:
    variable = model.trainable_variables[-1]
    variable.assign(variable + 0.01)


@case("control_divergence_fit", "control: a weight changed on rank 1 only, in `fit`", NONE,
      """The consistency check's control in fit: a callback on rank 1 adds 0.01 to the last
      bias after a batch. Every rank must stop at the epoch's end, naming that variable.""")
def control_divergence_fit(ctx):
    return outcome(fit_pattern(ctx, standard(mlp), reference=False, fit_kw=two_epochs(
        lambda rank: [on_rank(ctx, 1, nudge, at="batch")])))


@case("stop_training_rank0", "`stop_training` (EarlyStopping) on rank 0 only", NONE,
      """A callback on rank 0 alone sets model.stop_training at epoch 1's end: rank 0 leaves
      the loop while the other rank starts epoch 2. Every rank stops with one line instead of
      waiting in a collective.""")
def stop_training_rank0(ctx):
    def stop(model):
        model.stop_training = True
    return outcome(fit_pattern(ctx, standard(mlp), reference=False, fit_kw=two_epochs(
        lambda rank: [on_rank(ctx, 0, stop)])))


@case("initial_epoch_rank0", "`initial_epoch` on rank 0 only (a restore on one rank)", NONE,
      """Rank 0 starts at epoch 2 (as BackupAndRestore does on the rank that restores), the
      other rank at epoch 1: they would run different numbers of epochs. Every rank stops
      before the first step, naming both epochs.""")
def initial_epoch_rank0(ctx):
    return outcome(fit_pattern(ctx, standard(mlp), reference=False, fit_kw=lambda rank: {
        "epochs": 3, "initial_epoch": 1 if rank == 0 else 0}))


@case("validation_data_rank0", "`validation_data` on rank 0 only", NONE,
      """fit(validation_data=...) on rank 0 alone: its validation (and the averaging of
      val_loss, and of the normalization statistics before it) would wait for ranks that
      never validate. Every rank stops at the validation, naming it.""")
def validation_data_rank0(ctx):
    xs, ys = data()
    held = (xs[:16], ys[:16])
    return outcome(fit_pattern(ctx, standard(mlp), reference=False, fit_kw=lambda rank: {
        "validation_data": held} if rank == 0 else {}))


@case("metrics_global", "AUC, precision and recall in `fit` and `evaluate()`", EXACT,
      """A binary head compiled with AUC, Precision and Recall (not means of equal parts: a
      mean of the ranks' results is not the global one). Every rank's History, validation
      and evaluate(callbacks=[dist.GlobalMetrics()]) must give what 1 rank at 2B gives over
      the global batches: each metric's state is added over the ranks before its result is
      read.""")
def metrics_global(ctx):
    tf = ctx.tf
    xs, ys = data()
    ys = (ys % 2).astype("float32")

    def train(role: str):
        rank = ctx.rank if role == "rank" else None
        tf.keras.utils.set_random_seed(SEED + (ctx.rank if role == "rank" else 0))
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                     tf.keras.layers.Dense(16, activation="tanh"),
                                     tf.keras.layers.Dense(1)])
        opt = sgd(tf)
        model.compile(ctx.dist.distributed_optimizer(opt) if rank is not None else opt,
                      tf.keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=False,
                      metrics=[tf.keras.metrics.AUC(from_logits=True, name="auc"),
                               tf.keras.metrics.Precision(thresholds=0.0, name="precision"),
                               tf.keras.metrics.Recall(thresholds=0.0, name="recall")])
        picked = rows(rank)
        held = rows(rank)[::2]   # validation: half of this rank's rows (the global: half of all)
        history = model.fit(xs[picked], ys[picked], batch_size=BATCH * (1 if rank is not None
                                                                         else ctx.size),
                            epochs=1, shuffle=False, verbose=0,
                            validation_data=(xs[held], ys[held]),
                            callbacks=ctx.dist.fit_callbacks() if rank is not None else [])
        scores = model.evaluate(xs[picked], ys[picked], verbose=0, return_dict=True,
                                callbacks=[ctx.dist.GlobalMetrics()] if rank is not None else [])
        return model, {k: v[-1] for k, v in history.history.items()}, scores

    model, logged, scores = train("rank")
    reference, ref_logged, ref_scores = train("reference")
    checks = {}
    def same(a: float, b: float) -> list:
        return [bool(abs(a - b) < 1e-6), f"{a:.6f} vs {b:.6f}"]
    for name in ("auc", "precision", "recall", "val_auc", "val_precision"):
        checks[f"History {name} = 1 rank's"] = same(logged[name], ref_logged[name])
    for name in ("auc", "precision", "recall"):
        checks[f"evaluate() {name} = 1 rank's"] = same(scores[name], ref_scores[name])
    # Control: the mean of the ranks' own AUCs is not the global one.
    own = tf.keras.metrics.AUC(from_logits=True)
    own.update_state(ys[rows(ctx.rank)], model.predict(xs[rows(ctx.rank)], verbose=0))
    mean = float(np.mean(ctx.dist.allgather_object(float(own.result()))))
    checks["control: the mean of per-rank AUCs differs"] = [
        bool(abs(mean - ref_scores["auc"]) > 1e-4), f"{mean:.6f} vs {ref_scores['auc']:.6f}"]
    return Outcome(model.get_weights(), reference.get_weights(), checks)


def own_loop(ctx: Context, check: Callable[[Any, Any, int], None]) -> Any:
    """A user's own loop: dist.distributed_tape, a plain optimizer, 2 epochs of this rank's
    batches, rank 1 nudging the last bias after epoch 1's steps, then ``check(model,
    optimizer, epoch)`` at each epoch's end."""
    tf = ctx.tf
    xs, ys = data()
    tf.keras.utils.set_random_seed(SEED + ctx.rank)
    model, optimizer = mlp(ctx, "rank"), sgd(tf)
    ctx.dist.broadcast_variables(model.variables)
    loss_fn = loss(tf)
    picked = rows(ctx.rank).reshape(STEPS, BATCH)
    for epoch in range(2):
        for batch in picked:
            with tf.GradientTape() as tape:
                value = loss_fn(ys[batch], model(xs[batch], training=True))
            grads = ctx.dist.distributed_tape(tape).gradient(value, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if epoch == 0 and ctx.rank == 1:
            nudge(model)
        check(model, optimizer, epoch)
    return model


@case("control_divergence_tape", "control: a weight changed on rank 1 only, own tape loop",
      NONE, """The consistency check's control for a loop of one's own: dist.distributed_tape,
      a plain optimizer, dist.check_consistency(model.trainable_variables, optimizer) at each
      epoch's end; rank 1 nudges the last bias. Every rank stops, naming that variable.""")
def control_divergence_tape(ctx):
    def check(model, optimizer, epoch):
        ctx.dist.check_consistency(model.trainable_variables, optimizer,
                                   when=f"after epoch {epoch + 1}")
    return Outcome(own_loop(ctx, check).get_weights())


@case("control_divergence_custom_loop", "control: a weight changed on rank 1 only, hvdtrain's "
      "custom loop", NONE, """hvdtrain's custom loop as a library (custom_loop.TrainStep and
      run_epochs) with dist.ConsistencyCheck among its callbacks; rank 1 nudges the last bias
      after a batch. Every rank stops at the epoch's end, naming that variable.""")
def control_divergence_custom_loop(ctx):
    from hvdtrain.config import HorovodConfig
    from hvdtrain.training import custom_loop
    tf = ctx.tf
    xs, ys = data()
    tf.keras.utils.set_random_seed(SEED + ctx.rank)
    model, optimizer = mlp(ctx, "rank"), sgd(tf)
    picked = rows(ctx.rank)
    batches = iter(tf.data.Dataset.from_tensor_slices((xs[picked], ys[picked]))
                   .batch(BATCH).repeat())
    custom_loop.run_epochs(
        custom_loop.TrainStep(model, optimizer, HorovodConfig()), batches, first_epoch=0,
        epochs=2, steps_per_epoch=STEPS, callbacks=[
            ctx.dist.ConsistencyCheck(optimizer=optimizer), on_rank(ctx, 1, nudge, at="batch")])
    return Outcome(model.get_weights())


@case("unequal_batches", "unequal batch counts (33 and 32 rows, batch 8)", NONE,
      """The user's own shards: rank 0 has 33 rows (5 batches, the last of 1 row), the other
      rank 32 (4 batches). Nothing to compare with: hvdtrain must stop every rank with one
      line, not hang.""")
def unequal_batches(ctx):
    extra = lambda rank: np.concatenate([rows(rank), [0]]) if rank == 0 else rows(rank)
    return outcome(fit_pattern(ctx, standard(mlp), shard=extra, reference=False))


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


@case("shuffle_shard_after_fit", "`shuffle().shard()` built after a `fit`, seeded alike", NONE,
      """Every rank seeded alike (set_random_seed), a model with Dropout fit with
      dist.fit_callbacks(), then a new pipeline, range(64).shuffle(64) (no seed of its own)
      .shard(2, rank): the shuffle must take the same order on every rank, so the shards
      must not overlap. Each rank's dropout masks must still be its own.""")
def shuffle_shard_after_fit(ctx):
    tf = ctx.tf
    model = seeded_alike_fit(ctx, dropout_model)
    shard = sorted(int(v) for v in tf.data.Dataset.range(ROWS).shuffle(ROWS).shard(
        ctx.size, ctx.rank))
    shards = ctx.dist.allgather_object(shard)
    common = len(set(shards[0]) & set(shards[1]))
    masks = ctx.dist.allgather_object(
        model.get_layer("drop")(tf.ones((BATCH, 16)), training=True).numpy() != 0)
    differ = float(np.mean(masks[0] != masks[1]))
    return Outcome(model.get_weights(), checks={
        "the shards do not overlap": [common == 0, f"{common} of {ROWS} rows in both"],
        "masks differ across ranks": [differ > 0, f"{differ:.0%} of mask entries differ"]})


@case("unequal_batches_unknown_length", "unequal batch counts, a dataset of unknown length "
      "(`filter`)", NONE,
      """A tf.data pipeline with a filter, whose length tf.data cannot know: rank 0 has 5
      batches, the other rank 4. The rank that runs out first must not leave the other
      waiting in its all-reduce: every rank stops with one line naming each rank's step
      count.""")
def unequal_batches_unknown_length(ctx):
    picked = np.concatenate([rows(0), rows(1)[:BATCH]]) if ctx.rank == 0 else rows(ctx.rank)
    return Outcome(seeded_alike_fit(ctx, mlp, unknown_length(ctx, picked)).get_weights())


@case("unequal_batches_steps_per_execution", "unequal batch counts, unknown length, "
      "`steps_per_execution=2`", NONE,
      """As above, with compile(steps_per_execution=2): rank 0 has 3 batches, the other rank
      4, so each makes 2 calls of fit's train function, and the ranks part ways inside the
      last one (rank 0 runs one step there, the other two). Counting calls would see nothing,
      and the other rank would apply a step of its own: every rank must stop with one line
      naming each rank's step count. The check of the weights at the epoch's end is off
      (consistency_check=False), so that nothing else catches it.""")
def unequal_batches_steps_per_execution(ctx):
    if not keras3(ctx):
        raise NotOffered("Keras 2's fit refuses data of unknown length with "
                         "steps_per_execution > 1")
    picked = rows(0)[:-BATCH] if ctx.rank == 0 else rows(ctx.rank)
    return Outcome(seeded_alike_fit(ctx, mlp, unknown_length(ctx, picked),
                                    callbacks_kw={"consistency_check": False},
                                    steps_per_execution=2).get_weights())


def unknown_length(ctx: Context, picked: np.ndarray) -> Any:
    """The ``picked`` rows in batches, through a filter: a dataset whose length tf.data cannot
    know."""
    xs, ys = data()
    return ctx.tf.data.Dataset.from_tensor_slices((xs[picked], ys[picked])).filter(
        lambda x, y: True).batch(BATCH)


@case("save_every_rank", "`model.save`, `ModelCheckpoint`, `BackupAndRestore`, `TensorBoard` "
      "on every rank, one path", NONE,
      """Every rank fits with ModelCheckpoint, BackupAndRestore and TensorBoard into the same
      folder, then saves
      the model (.keras) and its weights (.weights.h5) to the same paths 3 times, each time
      loading both back. Two ranks writing one file at once would leave a corrupt zip or
      fail on HDF5's lock: each file must load on every rank, and TensorBoard must hold one
      run (rank 0's), not one per rank.""")
def save_every_rank(ctx):
    tf = ctx.tf
    folder = ctx.out / "save_every_rank"
    folder.mkdir(exist_ok=True)
    callbacks = lambda: [tf.keras.callbacks.ModelCheckpoint(str(folder / "checkpoint.keras")),
                         tf.keras.callbacks.BackupAndRestore(str(folder / "backup")),
                         tf.keras.callbacks.TensorBoard(str(folder / "board"))]
    trained = fit_pattern(ctx, standard(mlp), reference=False,
                          fit_kw=lambda rank: {"callbacks": callbacks()})
    failed = []
    for turn in range(3):
        trained.model.save(str(folder / "model.keras"))
        trained.model.save_weights(str(folder / "model.weights.h5"))
        ctx.dist.allgather_object(turn)   # every rank's writes done before any reads
        try:
            tf.keras.models.load_model(str(folder / "model.keras"), compile=False)
            trained.model.load_weights(str(folder / "model.weights.h5"))
        except Exception as error:  # noqa: BLE001  (what a user would meet when loading)
            failed.append(first_line(error))
        ctx.dist.allgather_object(turn)
    runs = sum(len(files) for _, _, files in os.walk(folder / "board" / "train"))
    return outcome(trained, **{
        "every file loads on every rank": [not failed, "; ".join(failed[:1]) or "3 of 3"],
        "TensorBoard holds one run": [runs == 1, f"{runs} event file(s)"]})


import horovod_api_cases  # noqa: E402,F401  (Horovod's API: its cases, after these)


def skipping_model(ctx: Context):
    """Dense, Dense, Dense, whose middle layer is skipped where ``skip`` is set (built with
    all three first)."""
    tf = ctx.tf

    class Skipping(tf.keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.skip = False
            self.first, self.middle, self.last = (tf.keras.layers.Dense(16, activation="tanh"),
                                                  tf.keras.layers.Dense(16, activation="tanh"),
                                                  tf.keras.layers.Dense(CLASSES))

        def call(self, x):
            x = self.first(x)
            return self.last(x if self.skip else self.middle(x))

    return Skipping()


@case("train_on_batch_no_broadcast", "a `train_on_batch` loop, never broadcast", NONE,
      """Each rank builds its model from its own seed, compiles it with the distributed
      optimizer and calls train_on_batch on its batches: no fit_callbacks, no broadcast. The
      optimizer's first update takes rank 0's variables on every rank, so the ranks must end
      as one model (not 1 rank at 2B: the first gradients were taken at each rank's own
      initial weights).""")
def train_on_batch_no_broadcast(ctx):
    tf = ctx.tf
    tf.keras.utils.set_random_seed(SEED + ctx.rank)
    model, opt = standard(mlp)(ctx, "rank")
    model.compile(optimizer=opt, loss=loss(tf), jit_compile=False)
    xs, ys = data()
    for batch in np.split(rows(ctx.rank), STEPS):
        model.train_on_batch(xs[batch], ys[batch])
    return Outcome(model.get_weights())


@case("layer_skipped_on_rank", "a layer skipped on one rank (a Python `if`)", NONE,
      """A subclassed model built with all its layers, whose call skips the middle Dense on
      rank 1 (a Python if on the rank, or on something only one rank sees): that rank has no
      gradient for it, so the ranks' all-reduces differ. Every rank must stop with one line
      naming the variable, not wait.""")
def layer_skipped_on_rank(ctx):
    def build(c: Context, role: str):
        model = skipping_model(c)
        model(np.zeros((1, FEATURES), "float32"))
        model.skip = c.rank == 1
        return model
    return Outcome(seeded_alike_fit(ctx, build).get_weights())


# ---------------------------------------------------------------------------------------------
# Running the cases

def first_line(error: BaseException) -> str:
    """The exception's type and the first line that says what went wrong: TensorFlow's errors
    open with "Graph execution error:" and the Python stack of the node, then the message."""
    lines = [line for line in str(error).splitlines() if line.strip()
             and not line[0].isspace() and not line.startswith(("Graph execution error",
                                                                  "Detected at node",
                                                                  "<stack traces"))]
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", lines[0] if lines else "")
    return f"{type(error).__name__}: {text[:200]}"


def run_case(entry: Case, ctx: Context) -> dict:
    """One case on this rank: how it ended, and the comparisons."""
    tf, dist = ctx.tf, ctx.dist
    from hvdtrain.errors import UserError
    tf.keras.backend.clear_session()          # Keras' layer numbering starts again
    started = time.monotonic()
    status, message, result = "done", "", None
    try:
        result = entry.run(ctx)
    except UserError as e:
        status, message = "refused", str(e)
    except NotOffered as e:
        status, message = "not offered", str(e)
    except Exception as e:  # noqa: BLE001  the table records what any case raised
        status = "hang" if dist.lost_a_rank(e) else "error"
        message = first_line(e)
        if status == "error":
            traceback.print_exc()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    record: dict[str, Any] = {"status": status, "message": message,
                              "seconds": round(time.monotonic() - started, 2)}
    if status == "hang":
        return record
    try:
        # Every rank's state: the comparison, and a barrier that shows a rank stuck in the case.
        everyone = dist.allgather_object(result.state if result else None)
    except Exception as e:  # noqa: BLE001
        if not dist.lost_a_rank(e):
            raise
        record.update(status="hang", message=f"{message} (then: {first_line(e)})".strip())
        return record
    if result is not None:
        record["across"] = (largest(result.state, everyone[0])
                            if all(s is not None for s in everyone) else None)
        record["largest_weight"] = max(float(np.max(np.abs(w))) for w in result.state)
        if result.reference is not None:
            record["to_2b"] = largest(result.state, result.reference)
            record["reference_scale"] = max(float(np.max(np.abs(w))) for w in result.reference)
        record["checks"] = result.checks
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cases", default="", help="comma-separated names (default: all)")
    args = parser.parse_args()
    rank_process.load_tensorflow()
    import tensorflow as tf
    from hvdtrain import distributed as dist
    world = dist.init(device="cpu", stall_warning_s=STALL_WARNING_S, stall_abort_s=STALL_ABORT_S)
    ctx = Context(tf, dist, world.rank, world.size, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = args.cases.split(",") if args.cases else [c.name for c in CASES]
    by_name = {c.name: c for c in CASES}
    report = {"stack": world.stack, "size": world.size, "cases": {}}
    path = args.out / f"rank{world.rank}.json"
    for name in chosen:
        if world.is_chief:
            print(f"case {name} start", flush=True)
        record = run_case(by_name[name], ctx)
        report["cases"][name] = record
        path.write_text(json.dumps(report, indent=1))
        if record["status"] == "hang":   # Horovod is shut down: the next job goes on
            break


if __name__ == "__main__":
    main()
    rank_process.end_rank()
