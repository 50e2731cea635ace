"""Callbacks without MPI: rank 0's progress output and the stall watchdog, driven with a fake
clock, and the exact eval's schedule."""
from __future__ import annotations

import io
import time

import pytest

from hvdtrain import callbacks
from hvdtrain.callbacks import STALL_EXIT_CODE, ExactEvaluation, ProgressLine, StallWatchdog


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
    monkeypatch.setattr(callbacks.os, "_exit", codes.append)
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


def test_a_stopped_stall_watchdog_stays_quiet(exits):
    clock = FakeClock()
    watchdog = StallWatchdog(0.4, rank=0, clock=clock)
    watchdog.on_train_begin()
    watchdog.stop()                    # fit returned
    clock.now += 60
    watchdog._thread.join(timeout=5)
    assert exits == [] and not watchdog._thread.is_alive()
