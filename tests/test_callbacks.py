"""Rank 0's progress output, driven with a fake clock (no MPI)."""
from __future__ import annotations

import io

from hvdtrain.callbacks import ProgressLine


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
