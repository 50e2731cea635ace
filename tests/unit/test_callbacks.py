"""Callbacks without MPI: rank 0's progress output and the stall watchdog, driven with a fake
clock, the exact eval's schedule, and the lr schedule through Keras ``fit``."""
from __future__ import annotations

import io
import time

import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.distributed import watchdog as watchdog_module
from hvdtrain.training import schedules
from hvdtrain.training.callbacks import ExactEvaluation, LearningRateSchedule, ProgressLine
from hvdtrain.distributed.watchdog import STALL_EXIT_CODE, StallWatchdog


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_within_a_long_epoch_and_one_per_epoch():
    clock, out = FakeClock(), io.StringIO()
    progress = ProgressLine(2, steps_per_epoch=10, global_batch=64, every_seconds=5,
                            stream=out, clock=clock)
    progress.on_epoch_begin(0)
    for batch in range(10):
        clock.now += 1.0                       # one second per step
        progress.on_train_batch_end(batch, {"loss": 2.0 - batch / 10})
    progress.on_epoch_end(0, {"loss": 1.5, "accuracy": 0.5, "eval_loss": 1.2,
                              "eval_accuracy": 0.625, "lr": 0.1, "samples_per_sec": 64.0,
                              "epoch_seconds": 10.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == "  epoch 1/2 step 5/10  loss 1.6000 (rank 0)  64 samples/s  5s left"
    assert lines[1] == "  epoch 1/2 step 10/10  loss 1.1000 (rank 0)  64 samples/s  0s left"
    assert lines[2] == ("epoch 1/2  loss 1.5000  acc 0.5000  eval_loss 1.2000  eval_acc 0.6250"
                        "  lr 0.1  64 samples/s  10.0s")
    assert len(lines) == 3


def test_no_step_lines_when_disabled_or_epochs_are_short():
    for every in (0, 60):
        clock, out = FakeClock(), io.StringIO()
        progress = ProgressLine(1, steps_per_epoch=10, global_batch=8, every_seconds=every,
                                stream=out, clock=clock)
        progress.on_epoch_begin(0)
        for batch in range(10):
            clock.now += 1.0
            progress.on_train_batch_end(batch, {"loss": 1.0})
        assert out.getvalue() == ""


@pytest.mark.parametrize("every, evaluated", [(3, [3, 6, 7]), (1, [1, 2, 3, 4, 5, 6, 7]),
                                              (0, [7])])
def test_the_exact_eval_runs_every_k_epochs_and_after_the_last(every, evaluated):
    calls: list[int] = []

    def evaluate() -> dict:
        calls.append(len(calls))
        return {"eval_accuracy": float(calls[-1])}
    evaluation = ExactEvaluation(evaluate, every, last_epoch=7)
    seen = []
    for epoch in range(7):
        logs: dict = {}
        evaluation.on_epoch_end(epoch, logs)
        if logs:
            seen.append(epoch + 1)
            assert logs["eval_accuracy"] == calls[-1]   # this epoch's own evaluation
    assert seen == evaluated and len(calls) == len(evaluated)
    assert evaluation.latest == {"eval_accuracy": calls[-1]}


@pytest.fixture
def exits(monkeypatch) -> list[int]:
    """The codes the watchdog would have ended the process with (os._exit recorded instead)."""
    codes: list[int] = []
    monkeypatch.setattr(watchdog_module.os, "_exit", codes.append)
    return codes


def wait_until(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_the_stall_watchdog_ends_the_process_once_no_step_finished_in_time(exits, capsys):
    clock = FakeClock()
    watchdog = StallWatchdog(0.4, rank=1, clock=clock)   # it looks every 0.1 s of real time
    watchdog.on_train_begin()
    for batch in range(5):             # steps keep finishing within the bound: it stays quiet
        clock.now += 0.3
        watchdog.on_train_batch_end(batch)
        time.sleep(0.15)
    clock.now += 0.3
    watchdog.on_epoch_end(0)           # so does an epoch end
    time.sleep(0.15)
    assert exits == []
    clock.now += 0.5                   # then nothing finishes for longer than the bound
    assert wait_until(lambda: exits), "the watchdog never fired"
    watchdog.stop()
    watchdog._thread.join(timeout=5)
    assert set(exits) == {STALL_EXIT_CODE} == {1}
    assert "hvdtrain: error: rank 1: no training step finished in 0.4 s" in capsys.readouterr().err


def test_a_validation_pass_longer_than_the_bound_is_progress_batch_by_batch(exits):
    clock = FakeClock()
    watchdog = StallWatchdog(0.4, rank=0, clock=clock)
    watchdog.on_train_begin()
    watchdog.on_test_begin()
    for batch in range(5):             # 1.5 s of validation in all, each batch within the bound
        clock.now += 0.3
        watchdog.on_test_batch_end(batch)
        time.sleep(0.15)
    watchdog.on_test_end()
    assert exits == []
    clock.now += 0.5                   # control: then nothing, and it fires
    assert wait_until(lambda: exits), "the watchdog never fired"
    watchdog.stop()
    watchdog._thread.join(timeout=5)


def test_a_stopped_stall_watchdog_stays_quiet(exits):
    clock = FakeClock()
    watchdog = StallWatchdog(0.4, rank=0, clock=clock)
    watchdog.on_train_begin()
    watchdog.stop()                    # fit returned
    clock.now += 60
    watchdog._thread.join(timeout=5)
    assert exits == [] and not watchdog._thread.is_alive()


def test_the_library_stall_watchdog_stops_at_the_end_of_fit_and_watches_the_next(exits, capsys):
    # dist.fit_callbacks() adds it under Gloo: nobody calls stop(), so fit's end must, and a
    # second fit must be watched again (a thread starts once only).
    clock = FakeClock()
    watchdog = StallWatchdog(0.4, rank=0, clock=clock, setting="dist.init(stall_abort_s=...)")
    watchdog.on_train_begin()
    first = watchdog._thread
    watchdog.on_train_end()            # the first fit returned
    clock.now += 60
    first.join(timeout=5)
    assert exits == [] and not first.is_alive()
    watchdog.on_train_begin()          # the second fit
    assert watchdog._thread is not first and watchdog._thread.is_alive()
    clock.now += 60                    # control: it still fires while a fit runs
    assert wait_until(lambda: exits), "the watchdog never fired in the second fit"
    watchdog.stop()
    assert "(dist.init(stall_abort_s=...))" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The lr schedule, through fit as the Trainer runs it

LR = {"base_lr": 0.1, "peak_lr": 0.4, "warmup_steps": 3, "total_steps": 8}


class LrSeen(tf.keras.callbacks.Callback):
    """(optimizer step, lr) each step trains with: read after the schedule set it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, float]] = []

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        optimizer = self.model.optimizer
        self.seen.append((int(optimizer.iterations.numpy()),
                          float(np.asarray(optimizer.learning_rate))))


def fit_with(schedule: LearningRateSchedule, epochs: int, model: tf.keras.Model | None = None
             ) -> tuple[tf.keras.Model, list[tuple[int, float]]]:
    """``epochs`` epochs of 4 steps under ``schedule``; the model and what each step saw."""
    if model is None:
        model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    seen = LrSeen()
    x = np.ones((16, 2), np.float32)
    model.fit(x, x[:, :1], batch_size=4, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[schedule, seen])
    return model, seen.seen


@pytest.mark.parametrize("decay", ["constant", "cosine"])
def test_every_step_trains_with_the_lr_of_its_optimizer_step(decay):
    schedule = LearningRateSchedule(**LR, decay=decay)
    _, seen = fit_with(schedule, epochs=2)
    expected = [(step, schedules.lr_at_step(step, **LR, decay=decay)) for step in range(8)]
    assert [s for s, _ in seen] == [s for s, _ in expected]
    assert [lr for _, lr in seen] == pytest.approx([lr for _, lr in expected], rel=1e-6)
    # The control: the warmup and the cosine move the lr, so a schedule that stopped setting it
    # too early (or never set it) would fail the comparison above.
    assert len({round(lr, 6) for _, lr in expected}) >= 4
    # Past warmup a constant lr is final: the per-step read and assign have stopped.
    assert schedule.settled == (decay == "constant")


def test_a_new_fit_sets_the_lr_again_after_it_settled():
    schedule = LearningRateSchedule(**LR, decay="constant")
    model, _ = fit_with(schedule, epochs=1)
    assert schedule.settled
    model.optimizer.learning_rate.assign(99.0)   # a restore or an elastic reset, say
    _, seen = fit_with(schedule, epochs=1, model=model)
    assert [lr for _, lr in seen] == pytest.approx([LR["peak_lr"]] * 4)
