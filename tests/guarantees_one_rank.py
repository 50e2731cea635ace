"""Guarantees cases, after tests/guarantees_options.py's: divergence from outside the patterns
those list, which the consistency check must stop in one line. What one rank does alone (a
callback on rank 0 changing the learning rate or stopping, initial_epoch or validation_data on
rank 0 only), scripts that never distribute (compile("adam"), the same arrays on every rank),
metrics that are not means of the ranks' own (AUC, precision, recall; also read eagerly, and
an evaluate() on rank 0 alone after a fit that stopped), and the check's controls:
a weight changed on rank 1 in fit (also in a late epoch, which the check's cadence may reach
only at the end of training), in an own tape loop and in hvdtrain's custom loop.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from guarantees_patterns import data, fit_pattern, loss, mlp, outcome, rows, sgd, standard
from guarantees_registry import (BATCH, EXACT, FEATURES, NONE, SEED, STEPS, Context, Outcome,
                                 case)


def on_rank(ctx: Context, rank: int, act: Callable, *, at: str = "epoch_end",
            epoch: int | None = None) -> Any:
    """A callback that runs ``act(model)`` on ``rank`` alone: at each epoch's end, or after
    the second batch of each epoch (``at="batch"``), as a user's callback under
    ``if rank == 0`` does; in epoch ``epoch`` (from 0) alone, where given."""
    tf = ctx.tf

    class OnOneRank(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, current, logs=None):
            self.now = epoch is None or current == epoch

        def on_epoch_end(self, current, logs=None):
            if at == "epoch_end" and ctx.rank == rank and self.now:
                act(self.model)

        def on_train_batch_end(self, batch, logs=None):
            if at == "batch" and batch == 1 and ctx.rank == rank and self.now:
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


@case("control_divergence_late", "control: a weight changed on rank 1 only, in a late epoch",
      NONE, """The same change in the last of 5 short epochs, whose ends the check's cadence
      passes over (their training is too short to pay for comparing every weight): every rank
      must stop at the end of training at the latest, naming that variable.""")
def control_divergence_late(ctx):
    return outcome(fit_pattern(ctx, standard(mlp), reference=False, fit_kw=lambda rank: {
        "epochs": 5, "callbacks": [on_rank(ctx, 1, nudge, at="batch", epoch=4)]
        if rank is not None else []}))


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
    return global_metrics(ctx, eager=False)


@case("metrics_global_eager", "AUC, precision and recall with `run_eagerly=True`", EXACT,
      """The same with compile(run_eagerly=True), where Keras reads the metrics' results
      after every batch, outside a traced step: they must still come out as 1 rank's at 2B,
      each sample counted once.""")
def metrics_global_eager(ctx):
    return global_metrics(ctx, eager=True)


def global_metrics(ctx: Context, *, eager: bool) -> Outcome:
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
                      run_eagerly=eager,
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


@case("evaluate_rank0_after_stop", "`evaluate()` on rank 0 alone after a `fit` that stopped",
      NONE, """fit with dist.fit_callbacks() stops on every rank (initial_epoch on rank 0
      only), the script catches hvdtrain's error, and rank 0 alone evaluates: its evaluate()
      must return rank 0's own metrics, not wait for the other rank in the metrics' sum (fit
      ended without its end, where the global metrics are let go).""")
def evaluate_rank0_after_stop(ctx):
    from hvdtrain.errors import UserError
    tf = ctx.tf
    xs, ys = data()
    tf.keras.utils.set_random_seed(SEED)   # the same start: fit stops before its broadcast
    model = mlp(ctx, "rank")
    model.compile(ctx.dist.distributed_optimizer(sgd(tf)), loss(tf), metrics=["accuracy"],
                  jit_compile=False)
    mine = rows(ctx.rank)
    stopped = ""
    try:
        model.fit(xs[mine], ys[mine], batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                  initial_epoch=1 if ctx.rank == 0 else 0, callbacks=ctx.dist.fit_callbacks())
    except UserError as e:
        stopped = str(e)
    checks = {"fit stopped on every rank": [bool(stopped), stopped[:60]]}
    if ctx.rank == 0:
        scores = model.evaluate(xs[mine], ys[mine], batch_size=BATCH, verbose=0,
                                return_dict=True)
        own = float(loss(tf)(ys[mine], model.predict(xs[mine], verbose=0)))
        checks["rank 0's evaluate() alone gives its own loss"] = [
            bool(abs(scores["loss"] - own) < 1e-5), f"{scores['loss']:.6f} vs {own:.6f}"]
    return Outcome(model.get_weights(), None, checks)


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
