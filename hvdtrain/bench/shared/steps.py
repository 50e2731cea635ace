"""Timing a training job's steps: the step timer a rank's Keras fit calls, and the arithmetic
on what it recorded (pure, tested without MPI): the repeats' rates, the step breakdown, the
weak-scaling efficiency."""
from __future__ import annotations

import statistics
import time
from typing import Sequence


def repeat_rates(per_rank: Sequence[dict]) -> list[float]:
    """Total samples/s per repeat: the samples every rank counted, over the slowest rank's
    time for that repeat. ``per_rank[r]`` = {"samples": [...], "seconds": [...]}."""
    repeats = {len(r["seconds"]) for r in per_rank} | {len(r["samples"]) for r in per_rank}
    if len(repeats) != 1:
        raise ValueError(f"ranks timed different numbers of repeats: {sorted(repeats)}")
    count = repeats.pop()
    return [sum(r["samples"][i] for r in per_rank) / max(r["seconds"][i] for r in per_rank)
            for i in range(count)]


def weak_scaling_efficiency(rate_n: float, ranks: int, rate_1: float) -> float:
    """T_N / (N * T_1): 1.0 when N ranks do N times the work of one in the same time."""
    return rate_n / (ranks * rate_1)


# A check of the benchmark itself (its tests set it): "RANK:SECONDS" makes that rank sleep
# before each of its steps, as a slow rank would; the total rate and efficiency must fall.
SLOW_RANK_ENV = "HVDTRAIN_BENCH_SLOW_RANK"


def slow_rank_delay(value: str, rank: int) -> float:
    """Seconds this ``rank`` sleeps before each step under SLOW_RANK_ENV=``value`` (0: none)."""
    if not value:
        return 0.0
    slow, _, seconds = value.partition(":")
    return float(seconds) if int(slow) == rank else 0.0


def step_timer(delay_s: float = 0.0):
    """A Keras callback that records, per epoch, when each training step starts and ends; it
    sleeps ``delay_s`` before each step (a slow rank, see SLOW_RANK_ENV). TensorFlow imports
    here."""
    import tensorflow as tf

    class StepTimer(tf.keras.callbacks.Callback):
        """Each epoch: when each of this rank's steps started (after the earlier callbacks'
        batch-begin hooks and the delay) and when it ended."""

        def __init__(self) -> None:
            super().__init__()
            self.epochs: list[list[float]] = []
            self.starts: list[list[float]] = []

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.epochs.append([])
            self.starts.append([])

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            if delay_s:
                time.sleep(delay_s)
            self.starts[-1].append(time.perf_counter())

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.epochs[-1].append(time.perf_counter())
    return StepTimer()


def timed_repeats(epochs: list[list[float]], warmup: int, batch_size: int
                  ) -> dict[str, list[float]]:
    """A step timer's epochs past ``warmup``: each repeat's seconds (first step's end to last
    step's end) and the samples its steps after the first trained."""
    timed = epochs[warmup:]
    return {"seconds": [steps[-1] - steps[0] for steps in timed],
            "samples": [(len(steps) - 1) * batch_size for steps in timed]}


def step_breakdown(starts: list[list[float]], ends: list[list[float]], warmup: int
                   ) -> dict[str, float]:
    """Where a step's time goes, from a step timer's epochs past ``warmup``: the median step
    (one end to the next) and, of it, the median time between steps (one step's end to the
    next one's start: the loop and the callbacks' hooks, not the train function)."""
    steps, between = [], []
    for begun, ended in zip(starts[warmup:], ends[warmup:]):
        steps += [b - a for a, b in zip(ended, ended[1:])]
        between += [b - a for a, b in zip(ended, begun[1:])]
    if not steps:
        raise ValueError("no timed epoch has two steps")
    return {"step_seconds_median": statistics.median(steps),
            "between_steps_seconds_median": statistics.median(between)}
