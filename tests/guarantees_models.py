"""Guarantees cases, the first that tests/guarantees_worker.py runs: the harness's control, then
a user's own model and fit through the library path: model structures (Sequential with and
without Input, subclassed, a shared layer, an own train_step with the optimizer, with a
distributed tape or with two optimizers), the optimizer's and fit's arguments (clipping, a
schedule, class and sample weights, steps_per_execution, validation_data), and layers with
gradients or state of their own (Embedding, BatchNormalization, Dropout).
"""
from __future__ import annotations

import numpy as np

from guarantees_patterns import (batch_norm_model, data, dropout_model, embedding_model,
                                 fit_pattern, largest, mlp, outcome, own_step_model, rows, sgd,
                                 standard, subclassed_class, with_ids)
from guarantees_registry import (BATCH, CLASSES, EXACT, FEATURES, NONE, ROWS, Context,
                                 NotOffered, case)


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
