"""Guarantees cases, the last that tests/guarantees_worker.py runs (after Horovod's API cases):
ranks whose steps would part ways within an epoch, before any check at its end. A
train_on_batch loop that never broadcasts (the distributed optimizer's first update must bring
the ranks together), and a layer skipped on one rank, whose all-reduces then differ: every rank
must stop with one line rather than wait (the case that may hang, so last).
"""
from __future__ import annotations

import numpy as np

from guarantees_patterns import data, loss, mlp, rows, seeded_alike_fit, standard
from guarantees_registry import CLASSES, FEATURES, NONE, SEED, STEPS, Context, Outcome, case


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
