"""Guarantees cases, after tests/guarantees_one_rank.py's: data the ranks do not share evenly
(unequal batch counts, of known and of unknown length, and with steps_per_execution), a shuffle
built after fit on ranks seeded alike, and files every rank saves to the same path.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from guarantees_patterns import (data, dropout_model, first_line, fit_pattern, mlp, outcome,
                                 rows, seeded_alike_fit, standard)
from guarantees_registry import BATCH, NONE, ROWS, Context, NotOffered, Outcome, case
from stack import keras3


@case("unequal_batches", "unequal batch counts (33 and 32 rows, batch 8)", NONE,
      """The user's own shards: rank 0 has 33 rows (5 batches, the last of 1 row), the other
      rank 32 (4 batches). Nothing to compare with: hvdtrain must stop every rank with one
      line, not hang.""")
def unequal_batches(ctx):
    extra = lambda rank: np.concatenate([rows(rank), [0]]) if rank == 0 else rows(rank)
    return outcome(fit_pattern(ctx, standard(mlp), shard=extra, reference=False))


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
    if not keras3():
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
