"""What the consistency check (hvdtrain/distributed/consistency.py) costs a run, for bench tax:
measured in a 2-rank job of the real Trainer, after its training, where the check acts (at one
rank it has no one to compare with and does nothing).

Three parts, each against what it adds to:
- its work at each epoch's start: the real callback's hook before the epoch's first step (an
  all-gather of the ranks' epoch and hyperparameters), driven on every rank together over a
  few epochs' worth and timed;
- its full comparison at an epoch's end (checksums of every trainable variable, and an
  all-gather), timed the same way; the cadence (hvdtrain/distributed/check_cadence.py) runs it
  once every ``epochs_between`` epochs of the timed length, so the two together, as a share of
  a timed epoch, are what the check costs a training. Timed inside ``fit`` the hooks would
  also hold the wait for the slower rank, which the next all-reduce waits for without the
  check;
- the in-graph record of the first epoch's batches (a checksum and a MinHash of each batch's
  inputs), timed alone on a batch of the job's shape, as a share of a step: it runs in the
  first epoch only.
The slowest rank's figure counts. The once-a-fit points (the first step's check, training's
begin and end: an all-gather each) are not in the figures.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

TARGET = 0.005   # issue 50: under 0.5% of an epoch


def mean_seconds(call: Callable[[int], Any], repeats: int) -> float:
    """``call(0)`` untimed (a trace, or the ranks falling in step), then the mean seconds of
    ``call(1)`` to ``call(repeats)``."""
    call(0)
    started = time.perf_counter()
    for i in range(1, repeats + 1):
        call(i)
    return (time.perf_counter() - started) / repeats


def record_seconds_per_batch(batch_shape: Sequence[int], repeats: int = 20) -> float:
    """The first epoch's in-graph record of one batch of ``batch_shape`` inputs (and its
    labels), traced as the train step traces it, timed over ``repeats`` calls after the first."""
    import tensorflow as tf
    from hvdtrain.distributed.batch_record import BatchRecord
    record = BatchRecord()
    record.arm()
    data = (tf.random.uniform(batch_shape), tf.zeros([batch_shape[0]], tf.int32))
    step = tf.function(lambda: record.record(data))
    # The first call traces, and takes the first batch's checksum.
    return mean_seconds(lambda _: step(), repeats)


def epoch_seconds(model: Any, epoch: float, repeats: int = 10) -> dict[str, float]:
    """A collective: the check's work on ``model`` and its optimizer, every rank in step (one
    untimed epoch first), the mean over ``repeats`` epochs: at an epoch's start
    (``ConsistencyCheck``'s hooks there) and its full comparison at an epoch's end; and the
    epochs the cadence trains between full comparisons, at epochs of ``epoch`` seconds."""
    from hvdtrain import distributed as dist
    from hvdtrain.distributed.check_cadence import epochs_between
    check = dist.ConsistencyCheck()
    check.set_model(model)

    def start(i: int) -> None:
        check.on_epoch_begin(i)
        check.on_train_batch_begin(0)

    def full(i: int) -> None:
        check.due = True   # as the cadence decides at the epochs it compares
        check.on_epoch_end(i)
    figures = {"check_start_seconds": mean_seconds(start, repeats),
               "check_full_seconds": mean_seconds(full, repeats)}
    return {**figures,
            "check_epochs_between": epochs_between(figures["check_full_seconds"], epoch,
                                                   figures["check_start_seconds"])}


def round_shares(ranks: Sequence[dict[str, Any]]) -> dict[str, float]:
    """One 2-rank job's figures from its ranks' raw rows (trainer_job's), the slowest rank's
    where not said: the full comparison's seconds and its share of a timed epoch; the epochs
    between full comparisons (rank 0's clock decides: its figures); the check's share of a
    training (each epoch's start, and the full comparison once every so many epochs); and the
    record's share of a step."""
    epochs = [statistics.median(r["seconds"]) for r in ranks]
    every = ranks[0]["check_epochs_between"]
    return {"full_seconds": max(r["check_full_seconds"] for r in ranks),
            "full_share": max(r["check_full_seconds"] / e for r, e in zip(ranks, epochs)),
            "epochs_between": every,
            "epoch_share": max((r["check_start_seconds"] + r["check_full_seconds"] / every) / e
                               for r, e in zip(ranks, epochs)),
            "first_epoch_step_share": max(r["record_seconds_per_batch"]
                                          / r["step_seconds_median"] for r in ranks)}
