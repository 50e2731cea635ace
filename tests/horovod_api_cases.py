"""Horovod's own API through hvdtrain (``import hvdtrain.horovod.tensorflow.keras as hvd``): the
cases of docs/horovod-api.md, each a Horovod script's pattern as Horovod's docs and examples
teach it, registered into the guarantees' CASES (tests/guarantees_registry.py, family "horovod")
so that they run in the same 2-rank job per stack as tests/guarantees_worker.py's others, on
the same data, with the same reference beside them (1 rank at twice the batch, a plain
optimizer, no hvdtrain).

This module: what a Horovod script does (hvd.init, hvd.DistributedOptimizer, hvd.callbacks),
the training patterns (fit, an own train_step, tape loops, Adasum, SyncBatchNormalization,
the callbacks, the optimizer's options, hvd.load_model, the control), and the table of
Horovod's names with the case that shows each (NAMES, HOROVOD_OWN: the page's). The cases
that call the API outside a training pattern (collectives, the elastic state, the refused
names) are tests/horovod_api_calls.py's, registered after these.

Importing this module loads no TensorFlow; each case imports the module under test.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from guarantees_patterns import (adam, batch_norm_model, data, embedding_model, fit_pattern, loss,
                                 mlp, outcome, own_step_model, rows, sgd, trained_elsewhere,
                                 with_ids)
from guarantees_registry import BATCH, EXACT, NONE, RANKS, SEED, STEPS, Context, Outcome, case


HOROVOD = "horovod"


def horovod_case(name: str, title: str, contract: str, note: str):
    return case(name, title, contract, note, family=HOROVOD)


def hvd_module() -> Any:
    import hvdtrain.horovod.tensorflow.keras as hvd
    hvd.init()   # as a Horovod script starts (a second init does nothing)
    return hvd


def wrapped(build: Callable = mlp, optimizer: Callable | None = None, **options: Any) -> Callable:
    """The model and optimizer of a Horovod script: ``hvd.DistributedOptimizer(opt,
    **options)`` on the ranks, the plain optimizer for the reference."""
    def setup(ctx: Context, role: str):
        opt = (optimizer or (lambda: sgd(ctx.tf)))()
        model = build(ctx, role)
        if role == "rank":
            opt = hvd_module().DistributedOptimizer(opt, **options)
        return model, opt
    return setup


def horovod_callbacks(*extra: Callable[[Any], Any]) -> Callable[[], list]:
    """The callbacks Horovod's Keras examples list first, then ``extra(hvd)``'s."""
    def callbacks() -> list:
        hvd = hvd_module()
        return [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                hvd.callbacks.MetricAverageCallback(), *(make(hvd) for make in extra)]
    return callbacks


def same_logs(ctx: Context, history: Any) -> list:
    everyone = ctx.dist.allgather_object(history.history)
    return [all(h == everyone[0] for h in everyone), repr(everyone[0])[:120]]


@horovod_case("hvd_fit", "`hvd.DistributedOptimizer` + `hvd.callbacks` in `fit`", EXACT,
              """tensorflow2_keras_mnist.py's pattern: hvd.DistributedOptimizer(opt), compile,
              fit with BroadcastGlobalVariablesCallback(0) and MetricAverageCallback(); the
              logs must be the same on every rank.""")
def hvd_fit(ctx):
    made: list = []

    def callbacks() -> list:
        made[:] = horovod_callbacks()()
        return made
    trained = fit_pattern(ctx, wrapped(), callbacks=callbacks)
    bringing = [type(c).__name__ for c in made if c.protections]
    return outcome(trained, **{"the same logs on every rank": same_logs(ctx, trained.history),
                               "the protections come once": [len(bringing) == 1,
                                                             ", ".join(bringing)]})


@horovod_case("hvd_metric_average_only", "only `MetricAverageCallback` listed", EXACT,
              """A script that lists MetricAverageCallback() alone, no broadcast callback:
              hvdtrain's protections come with whichever of Horovod's callbacks is listed
              first, so rank 0's state is still broadcast before the first step.""")
def hvd_metric_average_only(ctx):
    trained = fit_pattern(ctx, wrapped(), callbacks=lambda: [
        hvd_module().callbacks.MetricAverageCallback()])
    return outcome(trained, **{"the same logs on every rank": same_logs(ctx, trained.history)})


@horovod_case("hvd_unsharded", "the whole arrays on every rank, shuffled (Horovod's keras_mnist)",
              NONE, """Horovod's Keras examples shard nothing: every rank fits the whole data,
              shuffled by its own seed, and the epochs are scaled down instead. hvdtrain's
              check sees mostly the same samples on the ranks and says so in one line on rank
              0, without stopping the script (through dist.fit_callbacks() it stops:
              arrays_not_sharded in guarantees.md); the ranks must agree.""")
def hvd_unsharded(ctx):
    return outcome(fit_pattern(ctx, wrapped(), shard=lambda rank: rows(None),
                               fit_kw=lambda rank: {"shuffle": True}, reference=False,
                               callbacks=horovod_callbacks()))


@horovod_case("hvd_own_train_step", "own `train_step` with `hvd.DistributedOptimizer`", EXACT,
              """A subclassed model whose train_step takes a GradientTape's gradients and
              calls self.optimizer.apply_gradients, the optimizer from
              hvd.DistributedOptimizer.""")
def hvd_own_train_step(ctx):
    return outcome(fit_pattern(ctx, wrapped(own_step_model), callbacks=horovod_callbacks()))


@horovod_case("hvd_tape_loop", "`hvd.DistributedGradientTape` loop, broadcast after step 1",
              NONE, """tensorflow2_mnist.py's pattern: a loop of one's own, the tape wrapped
              by hvd.DistributedGradientTape, a plain optimizer, and
              hvd.broadcast_variables(model.variables) and (opt.variables) after the first
              step. Each rank's first gradient is taken at its own initial weights (Horovod
              broadcasts after that step), so 1 rank at 2B is not the contract; the ranks
              must agree.""")
def hvd_tape_loop(ctx):
    return Outcome(tape_loop(ctx).get_weights())


def tape_loop(ctx: Context, *, traced: bool = False, **tape_options: Any) -> Any:
    """tensorflow2_mnist.py's loop on this rank's batches, its tape given ``tape_options``;
    ``traced``: its step a tf.function, broadcast inside (tensorflow2_synthetic_benchmark.py's
    pattern, where the broadcasts become graph ops)."""
    tf = ctx.tf
    hvd = hvd_module()
    xs, ys = data()
    tf.keras.utils.set_random_seed(SEED + ctx.rank)
    model, opt, loss_fn = mlp(ctx, "rank"), sgd(tf), loss(tf)

    def step(x, y, first_batch):
        with tf.GradientTape() as tape:
            value = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, **tape_options)
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables() if callable(opt.variables)
                                    else opt.variables, root_rank=0)

    run = tf.function(step) if traced else step
    for number, batch in enumerate(rows(ctx.rank).reshape(STEPS, BATCH)):
        run(tf.constant(xs[batch]), tf.constant(ys[batch]), number == 0)
    return model


@horovod_case("hvd_tape_in_function", "the tape loop's step a `tf.function`, broadcast inside",
              NONE, """tensorflow2_synthetic_benchmark.py's pattern: the step (tape,
              apply_gradients, and at the first batch the broadcasts of model.variables and
              opt.variables) traced as a tf.function, so the broadcasts are graph ops; as the
              loop above, the ranks must agree.""")
def hvd_tape_in_function(ctx):
    return Outcome(tape_loop(ctx, traced=True).get_weights())


@horovod_case("hvd_adasum_tape", "`DistributedGradientTape(op=hvd.Adasum)`", NONE,
              """The same loop with Adasum, which combines the gradients by their directions,
              not an average, so there is no 1 rank at 2B to equal; the ranks must agree.""")
def hvd_adasum_tape(ctx):
    return Outcome(tape_loop(ctx, op=hvd_module().Adasum).get_weights())


@horovod_case("hvd_adasum_fit", "`DistributedOptimizer(op=hvd.Adasum)` in `fit`", NONE,
              """Adasum through the optimizer in fit: both stacks' optimizers reduce through
              hvdtrain's one reducer, Adasum too (Horovod's own Keras 2 optimizer has no
              Adasum).""")
def hvd_adasum_fit(ctx):
    return outcome(fit_pattern(ctx, wrapped(op=hvd_module().Adasum),
                               callbacks=horovod_callbacks(), reference=False))


@horovod_case("hvd_sync_batch_norm", "`hvd.SyncBatchNormalization`", EXACT,
              """Dense, hvd.SyncBatchNormalization, Dense: the batch moments all-reduced over
              the ranks, so 2 ranks at B normalize as 1 rank at 2B with Keras'
              BatchNormalization (the reference), moving statistics included.""")
def hvd_sync_batch_norm(ctx):
    sync = hvd_module().SyncBatchNormalization
    return outcome(fit_pattern(ctx, wrapped(
        lambda c, r: batch_norm_model(c, r, sync if r == "rank" else None)),
        callbacks=horovod_callbacks()))


@horovod_case("hvd_best_checkpoint", "`callbacks.BestModelCheckpoint`", NONE,
              """BestModelCheckpoint(filepath=..., monitor="val_loss") in a 2-epoch fit with
              validation data, each rank given a path of its own: rank 0's file must exist,
              the other ranks' not (only rank 0 writes).""")
def hvd_best_checkpoint(ctx):
    xs, ys = data()
    path = ctx.out / f"hvd-best-rank{ctx.rank}.keras"
    trained = fit_pattern(ctx, wrapped(), reference=False, callbacks=horovod_callbacks(
        lambda hvd: hvd.callbacks.BestModelCheckpoint(filepath=str(path))),
        fit_kw=lambda rank: {"epochs": 2, "validation_data": (xs[:BATCH], ys[:BATCH])})
    written = ctx.dist.allgather_object(path.exists())
    return outcome(trained, **{"written by rank 0 alone": [
        written == [True] + [False] * (ctx.size - 1), repr(written)]})


WARMUP_EPOCHS, SCHEDULE_FROM, LR_EPOCHS = 2, 2, 4


def horovod_rates(initial: float, size: int) -> list[float]:
    """The rate at each epoch's end, by the formulas Horovod's docs give: warmup from
    initial/size to initial, ``initial/size * (epoch * (size - 1) / warmup + 1)`` at the
    fractional epoch (its end: epoch + 1), then ``initial * 0.5 ** (epoch - start)``."""
    rates = []
    for epoch in range(LR_EPOCHS):
        if epoch < WARMUP_EPOCHS:
            rates.append(initial / size * ((epoch + 1) * (size - 1) / WARMUP_EPOCHS + 1))
        else:
            rates.append(initial * 0.5 ** (epoch - SCHEDULE_FROM))
    return rates


@horovod_case("hvd_lr_callbacks", "`LearningRateWarmupCallback` then `...ScheduleCallback`",
              NONE, """Horovod's ImageNet example's schedule: the rate (0.1 x size) warmed up
              over 2 epochs, then halved each epoch from epoch 2 (staircase), 4 epochs, SGD
              with momentum (momentum correction on); the rate logged at each epoch's end
              must be Horovod's formula's. The reference has no such schedule, so 1 rank at
              2B is not the contract; the ranks must agree.""")
def hvd_lr_callbacks(ctx):
    initial = 0.1 * ctx.size
    schedule = horovod_callbacks(
        lambda hvd: hvd.callbacks.LearningRateWarmupCallback(initial, WARMUP_EPOCHS),
        lambda hvd: hvd.callbacks.LearningRateScheduleCallback(initial, 0.5,
                                                               start_epoch=SCHEDULE_FROM))
    trained = fit_pattern(ctx, wrapped(), callbacks=schedule, reference=False,
                          fit_kw=lambda rank: {"epochs": LR_EPOCHS})
    logged = [float(v) for v in trained.history.history["lr"]]
    expected = horovod_rates(initial, ctx.size)
    holds = np.allclose(logged, expected, rtol=1e-6)
    return outcome(trained, **{"the rates are Horovod's": [
        bool(holds), f"{np.round(logged, 6).tolist()} vs {np.round(expected, 6).tolist()}"]})


def accumulated_reference(ctx: Context, passes: int, build: Callable = mlp) -> list:
    """1 rank at 2B, a plain optimizer: every ``passes`` global batches' gradients summed
    (Horovod's default, average_aggregated_gradients=False), then one update."""
    tf = ctx.tf
    xs, ys = data()
    tf.keras.utils.set_random_seed(SEED)
    model, opt, loss_fn = build(ctx, "reference"), sgd(tf), loss(tf)
    batches = rows(None).reshape(STEPS, RANKS * BATCH)
    for start in range(0, STEPS, passes):
        total = None
        for batch in batches[start:start + passes]:
            with tf.GradientTape() as tape:
                value = loss_fn(ys[batch], model(xs[batch], training=True))
            grads = tape.gradient(value, model.trainable_variables)
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        opt.apply_gradients(zip(total, model.trainable_variables))
    return model.get_weights()


@horovod_case("hvd_backward_passes", "`DistributedOptimizer(backward_passes_per_step=2)`",
              EXACT, """Horovod's local gradient aggregation in fit: 2 batches' gradients
              summed on each rank (Horovod's default, average_aggregated_gradients=False),
              then averaged over the ranks and applied once. The reference: every 2 global
              batches' gradients summed, then one update, at 1 rank x 2B.""")
def hvd_backward_passes(ctx):
    trained = fit_pattern(ctx, wrapped(backward_passes_per_step=2),
                          callbacks=horovod_callbacks(), reference=False)
    return Outcome(trained.model.get_weights(), accumulated_reference(ctx, 2))


@horovod_case("hvd_fp16", "`DistributedOptimizer(compression=hvd.Compression.fp16)`", NONE,
              """Gradients cast to float16 for the all-reduce, about 3 significant digits, so
              close to 1 rank at 2B, not equal (the difference is shown); the ranks must
              agree.""")
def hvd_fp16(ctx):
    compression = hvd_module().Compression.fp16
    return outcome(fit_pattern(ctx, wrapped(compression=compression),
                               callbacks=horovod_callbacks()))


def embedding(ctx: Context, role: str):
    return embedding_model(ctx, role, dense_first=False)


@horovod_case("hvd_sparse", "sparse gradient (Embedding), `DistributedOptimizer`", EXACT,
              """A model with an Embedding (its gradient an IndexedSlices, all-gathered over
              the ranks) and a Dense layer, through hvd.DistributedOptimizer.""")
def hvd_sparse(ctx):
    return outcome(fit_pattern(ctx, wrapped(embedding), callbacks=horovod_callbacks(),
                               x=with_ids(data()[0])))


@horovod_case("hvd_sparse_as_dense", "`DistributedOptimizer(sparse_as_dense=True)`", EXACT,
              """The same model with sparse_as_dense=True: the embedding's gradient made
              dense and all-reduced with the others.""")
def hvd_sparse_as_dense(ctx):
    return outcome(fit_pattern(ctx, wrapped(embedding, sparse_as_dense=True),
                               callbacks=horovod_callbacks(), x=with_ids(data()[0])))


@horovod_case("hvd_load_model", "`hvd.load_model` of a saved model, resumed", EXACT,
              """Horovod's resume pattern: every rank loads rank 0's saved model.keras
              (compiled, Adam's state inside) with hvd.load_model, which makes its optimizer
              distributed, and fits on with hvd.callbacks. The reference: the loaded model and
              its optimizer at 1 rank x 2B.""")
def hvd_load_model(ctx):
    tf = ctx.tf
    path = ctx.out / "hvd-load-model.keras"
    if ctx.rank == 0:
        trained_elsewhere(ctx).save(str(path))
    ctx.dist.allgather_object(None)   # the file is written before anyone reads it

    def setup(ctx: Context, role: str):
        if role == "reference":
            model = tf.keras.models.load_model(str(path))
        else:
            model = hvd_module().load_model(str(path))
        return model, model.optimizer
    return outcome(fit_pattern(ctx, setup, callbacks=horovod_callbacks()))


@horovod_case("hvd_control_not_wrapped", "control: `hvd.callbacks`, optimizer not wrapped", NONE,
              """The control: Horovod's callbacks in fit but an optimizer left plain (a
              forgotten hvd.DistributedOptimizer). hvdtrain's consistency check, which
              Horovod's callbacks bring along, must stop every rank before the first step.""")
def hvd_control_not_wrapped(ctx):
    def setup(ctx: Context, role: str):
        return mlp(ctx, role), adam(ctx.tf)
    return outcome(fit_pattern(ctx, setup, callbacks=horovod_callbacks(), reference=False))


# Horovod's own functions, re-exported unchanged (they touch no Keras): hvd_collectives checks
# that each is Horovod's.
HOROVOD_OWN = ["shutdown", "start_timeline", "stop_timeline", "mpi_enabled", "mpi_built",
               "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
               "cuda_built", "rocm_built", "ProcessSet", "global_process_set",
               "add_process_set", "remove_process_set", "grouped_allgather",
               "grouped_reducescatter", "Min", "Max", "Product", "is_homogeneous",
               "gpu_available", "broadcast_object_fn"]

# Horovod's public TF2/Keras names, each with the case that shows it works (the refused ones:
# the case hvd_refusals records each refusal's line).
NAMES = {
    **dict.fromkeys(["init", "size", "rank", "local_size", "local_rank", "cross_size",
                     "cross_rank", "is_initialized", "mpi_threads_supported", "allreduce",
                     "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
                     "join", "broadcast_object", "allgather_object", "Average", "Sum"],
                    "hvd_collectives"),
    "Compression.none": "hvd_fit", "Compression.fp16": "hvd_fp16",
    "DistributedOptimizer": "hvd_fit", "DistributedOptimizer in an own train_step":
        "hvd_own_train_step",
    "DistributedOptimizer(backward_passes_per_step=)": "hvd_backward_passes",
    "DistributedOptimizer(sparse_as_dense=)": "hvd_sparse_as_dense",
    "DistributedGradientTape": "hvd_tape_loop", "broadcast_variables": "hvd_tape_loop",
    "broadcast_variables inside a tf.function": "hvd_tape_in_function",
    "Adasum (DistributedGradientTape)": "hvd_adasum_tape",
    "Adasum (DistributedOptimizer in fit)": "hvd_adasum_fit",
    "SyncBatchNormalization": "hvd_sync_batch_norm",
    "callbacks.BestModelCheckpoint": "hvd_best_checkpoint",
    "load_model": "hvd_load_model",
    "callbacks.BroadcastGlobalVariablesCallback": "hvd_fit",
    "callbacks.MetricAverageCallback": "hvd_metric_average_only",
    "callbacks.LearningRateWarmupCallback": "hvd_lr_callbacks",
    "callbacks.LearningRateScheduleCallback": "hvd_lr_callbacks",
    **dict.fromkeys(["elastic.KerasState", "elastic.CommitStateCallback",
                     "elastic.UpdateBatchStateCallback", "elastic.UpdateEpochStateCallback"],
                    "hvd_elastic_state"),
}
