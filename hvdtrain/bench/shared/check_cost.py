"""What the consistency check (hvdtrain/distributed/consistency.py) costs a run, for bench tax:
measured in a 2-rank job of the real Trainer, after its training, where the check acts (at one
rank it has no one to compare with and does nothing).

Two parts, each against what it adds to:
- its work at each epoch: the real callback's hooks before the epoch's first step (an
  all-gather of the ranks' epoch and hyperparameters) and at its end (checksums of every
  trainable variable, and an all-gather), driven on every rank together over a few epochs'
  worth and timed; as a share of a timed epoch. Timed inside ``fit`` the hooks would also hold
  the wait for the slower rank, which the next all-reduce waits for without the check;
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


def epoch_seconds(model: Any, repeats: int = 10) -> float:
    """A collective: the check's work at one epoch (``ConsistencyCheck``'s hooks at an epoch's
    first step and its end) on ``model`` and its optimizer, every rank in step (one untimed
    epoch first), the mean over ``repeats`` epochs."""
    from hvdtrain import distributed as dist
    check = dist.ConsistencyCheck()
    check.set_model(model)

    def epoch(i: int) -> None:
        check.on_epoch_begin(i)
        check.on_train_batch_begin(0)
        check.on_epoch_end(i)
    return mean_seconds(epoch, repeats)


def round_shares(ranks: Sequence[dict[str, Any]]) -> dict[str, float]:
    """One 2-rank job's figures from its ranks' raw rows (trainer_job's), the slowest rank's:
    the check's seconds per epoch, their share of a timed epoch, the steps an epoch needs for
    the check to cost under TARGET of it, and the record's share of a step."""
    per_epoch = [r["check_seconds_per_epoch"] for r in ranks]
    return {"seconds_per_epoch": max(per_epoch),
            "epoch_share": max(s / statistics.median(r["seconds"])
                               for s, r in zip(per_epoch, ranks)),
            "steps_for_target": max(s / (TARGET * r["step_seconds_median"])
                                    for s, r in zip(per_epoch, ranks)),
            "first_epoch_step_share": max(r["record_seconds_per_batch"]
                                          / r["step_seconds_median"] for r in ranks)}
