"""Guarantees cases, after tests/guarantees_models.py's: how the gradients are reduced (fp16
compression, Adasum in fit and on a tape, accumulation by Keras and by Horovod), in what
precision (mixed_float16 set before and after wrapping) and whether under XLA; and a start
that rank 0 alone makes: weights, a tf.train.Checkpoint or a saved model restored on rank 0
only, or one model more built there first.
"""
from __future__ import annotations

from guarantees_patterns import (adam, fit_pattern, mlp, outcome, own_step_model, sgd, standard,
                                 trained_elsewhere)
from guarantees_registry import EXACT, NONE, NotOffered, case
from stack import keras3


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
    if not keras3():
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
        optimizer=lambda: sgd(tf, **({"gradient_accumulation_steps": 2} if keras3()
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
