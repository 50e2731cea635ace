"""The stall watchdog: ends a rank whose training has made no progress for too long.

For Gloo, where Horovod's own stall check does nothing, a rank waiting forever in an all-reduce
for a stalled peer (a rank with fewer batches, a rank stuck in its input pipeline) would hang the
job. hvdtrain's trainer and ``dist.fit_callbacks()`` both add it. No Horovod here.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

import tensorflow as tf

STALL_EXIT_CODE = 1


class StallWatchdog(tf.keras.callbacks.Callback):
    """Ends this process when fit has made no progress (a step, a validation batch, an epoch's
    start or end) for ``seconds``.

    The launcher then stops the other ranks. It watches from the start of each ``fit`` to its
    end (``on_train_end``); when ``fit`` raises, call ``stop()``, as the trainer does.
    ``setting`` names what the user changes, in the error line.
    """

    def __init__(self, seconds: float, rank: int, clock: Callable[[], float] = time.monotonic,
                 setting: str = "run.stall_abort_s"):
        super().__init__()
        self.seconds, self.rank, self.clock, self.setting = seconds, rank, clock, setting
        self._last = clock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._last = self.clock()
        if self._thread is None or not self._thread.is_alive():
            self._stopped = threading.Event()
            self._thread = threading.Thread(target=self._watch, args=(self._stopped,),
                                            daemon=True)
            self._thread.start()

    def _progress(self, *args: object, **kwargs: object) -> None:
        self._last = self.clock()

    # Progress: every step, and what fit does between steps (validation batch by batch, the
    # callbacks of an epoch's start and end), so that a long validation pass is not a stall.
    on_train_batch_begin = on_train_batch_end = _progress
    on_epoch_begin = on_epoch_end = _progress
    on_test_begin = on_test_batch_end = on_test_end = _progress

    def on_train_end(self, logs: dict | None = None) -> None:
        self.stop()

    def stop(self) -> None:
        """Ends the watch; the process is no longer ended."""
        self._stopped.set()

    def _watch(self, stopped: threading.Event) -> None:
        while not stopped.wait(min(1.0, self.seconds / 4)):
            if self.clock() - self._last > self.seconds:
                print(f"hvdtrain: error: rank {self.rank}: no training step finished in "
                      f"{self.seconds:g} s ({self.setting}): a rank stalled or a collective "
                      f"hangs; stopping. Under mpirun Horovod's stall check names the rank",
                      file=sys.stderr, flush=True)
                os._exit(STALL_EXIT_CODE)
