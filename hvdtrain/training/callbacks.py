"""Keras callbacks for a distributed fit, and ``assemble``, which puts them in the order that
matters: first those every rank runs (they contain collectives), then rank 0's printing and
writing, then the checkpoint that all ranks agree on."""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import tensorflow as tf

from hvdtrain.training import checkpoints, schedules
from hvdtrain.config import Config
from hvdtrain.errors import UserError
from hvdtrain.distributed.watchdog import StallWatchdog

if TYPE_CHECKING:
    from hvdtrain.distributed import World


@dataclass(frozen=True)
class Hooks:
    """The callbacks of one training run, in order, and the ones the Trainer reads back."""
    callbacks: list[tf.keras.callbacks.Callback]
    evaluation: "ExactEvaluation"
    throughput: "Throughput"
    watchdog: "StallWatchdog | None"


def assemble(config: Config, world: "World", *, run_dir: Path, checkpoint: tf.train.Checkpoint,
             steps: int, samples_per_epoch: int, peak_lr: float,
             evaluate: Callable[[], dict],
             metric_average: tf.keras.callbacks.Callback | None,
             statistics_average: tf.keras.callbacks.Callback,
             agree: Callable[[str | None], None],
             consistency: tf.keras.callbacks.Callback | None = None,
             extra: Sequence[tf.keras.callbacks.Callback] = ()) -> Hooks:
    """Every rank, in this order: the ``consistency`` check (a collective: first, so that it
    sees each epoch before any callback changes the optimizer), average the epoch's metrics
    over ranks (a collective; the custom loop adds its sums across ranks itself and passes
    None), stop all together on a NaN loss, the lr schedule, the normalization statistics
    averaged over ranks (a collective: the eval, the checkpoint and, at the end of training,
    the export all see the same ones), the exact eval (a collective), the throughput; then the
    numbers rank 0 reports; last, the checkpoint (rank 0 writes, all agree it worked) and ``extra``.
    Under Gloo, where Horovod's stall check is inert, a watchdog bounds the wait."""
    cfg = config
    # The schedule counts optimizer updates: one per backward_passes_per_step batches.
    updates = math.ceil(steps / cfg.horovod.backward_passes_per_step)
    lr = LearningRateSchedule(base_lr=cfg.optim.lr, peak_lr=peak_lr,
                              warmup_steps=round(cfg.optim.warmup_epochs * updates),
                              total_steps=cfg.train.epochs * updates, decay=cfg.optim.decay)
    evaluation = ExactEvaluation(evaluate, cfg.train.eval_every, cfg.train.epochs)
    throughput = Throughput(samples_per_epoch * world.size)  # this rank's samples, N ranks
    every_rank = [*([consistency] if consistency else []),
                  *([metric_average] if metric_average else []),
                  StopOnNonFiniteLoss(run_dir), lr, statistics_average, evaluation, throughput]
    chief_only: list[tf.keras.callbacks.Callback] = []
    if world.is_chief:
        if cfg.run.tensorboard:
            chief_only.append(tf.keras.callbacks.TensorBoard(
                str(run_dir / "tensorboard"), write_graph=False, profile_batch=0))
        chief_only += [ProgressLine(cfg.train.epochs, steps_per_epoch=steps,
                                    global_batch=cfg.train.batch_size * world.size,
                                    every_seconds=cfg.run.progress_every_s),
                       MetricsLog(run_dir / "metrics.jsonl")]
    last = [Checkpointer(checkpoint, run_dir, cfg.run.keep_checkpoints, is_chief=world.is_chief,
                         agree=agree), *extra]
    watchdog = (StallWatchdog(cfg.run.stall_abort_s, world.rank)
                if world.controller == "gloo" and world.size > 1 and cfg.run.stall_abort_s
                else None)
    return Hooks(every_rank + chief_only + last + ([watchdog] if watchdog else []),
                 evaluation, throughput, watchdog)


class LearningRateSchedule(tf.keras.callbacks.Callback):
    """Sets the lr before every step from the optimizer's own step counter, so a resumed run
    (whose counter is restored from the checkpoint) continues the schedule exactly.

    Once the lr can no longer change within this ``fit`` (past warmup, constant decay: the
    counter only grows), it stops reading the counter and assigning: that eager round trip
    before every step was the one cost hvdtrain added between the steps of plain ``fit`` at one
    rank (docs/stacks.md, Speed). A new ``fit`` (a resume, an elastic reset) checks again."""

    def __init__(self, *, base_lr: float, peak_lr: float, warmup_steps: int, total_steps: int,
                 decay: str):
        super().__init__()
        self.lr_for = lambda step: schedules.lr_at_step(
            step, base_lr=base_lr, peak_lr=peak_lr, warmup_steps=warmup_steps,
            total_steps=total_steps, decay=decay)
        self.final_from = lambda step: schedules.lr_is_final(
            step, warmup_steps=warmup_steps, decay=decay)
        self.current = base_lr
        self.settled = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.settled = False

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.settled:
            return
        step = int(self.model.optimizer.iterations.numpy())
        self.current = self.lr_for(step)
        self.model.optimizer.learning_rate.assign(self.current)
        self.settled = self.final_from(step)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = self.current


class ExactEvaluation(tf.keras.callbacks.Callback):
    """Runs ``evaluate`` (a collective: every rank must run it) every k epochs and at the last,
    adding eval_loss and eval_accuracy to the epoch's logs."""

    def __init__(self, evaluate: Callable[[], dict], every: int, last_epoch: int):
        super().__init__()
        self.evaluate, self.every, self.last_epoch = evaluate, every, last_epoch
        self.latest: dict = {}

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        due = epoch + 1 == self.last_epoch or (self.every and (epoch + 1) % self.every == 0)
        if due:
            self.latest = self.evaluate()
            if logs is not None:
                logs.update(self.latest)


class Throughput(tf.keras.callbacks.Callback):
    """Times each epoch and reports samples/s summed over all ranks."""

    def __init__(self, samples_per_epoch: int):
        super().__init__()
        self.samples_per_epoch = samples_per_epoch
        self.train_seconds = 0.0
        self.epochs_timed = 0
        self._start = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        seconds = time.perf_counter() - self._start
        self.train_seconds += seconds
        self.epochs_timed += 1
        if logs is not None:
            logs["epoch_seconds"] = seconds
            logs["samples_per_sec"] = self.samples_per_epoch / seconds


class ProgressLine(tf.keras.callbacks.Callback):
    """Rank 0's view: one line per epoch, and within a long epoch a line every ``every_seconds``
    (step, rank 0's running loss, throughput of all ranks, time left in the epoch)."""

    def __init__(self, epochs: int, *, steps_per_epoch: int, global_batch: int,
                 every_seconds: float = 30.0, stream=sys.stdout,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.epochs, self.steps, self.global_batch = epochs, steps_per_epoch, global_batch
        self.every_seconds, self.stream, self.clock = every_seconds, stream, clock
        self._epoch = 0
        self._last_line = self._first_step_end = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch
        self._last_line = self.clock()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = self.clock()
        if batch == 0:  # rates count from here: the first step also traces the graph
            self._first_step_end = now
        if (not self.every_seconds or now == self._first_step_end
                or now - self._last_line < self.every_seconds):
            return
        self._last_line = now
        done = batch + 1
        steps_per_s = (done - 1) / (now - self._first_step_end)
        loss = (logs or {}).get("loss", float("nan"))
        self._print(f"  epoch {self._epoch + 1}/{self.epochs} step {done}/{self.steps}  "
                    f"loss {loss:.4f} (rank 0)  {steps_per_s * self.global_batch:,.0f} "
                    f"samples/s  {(self.steps - done) / steps_per_s:.0f}s left")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        width = len(str(self.epochs))
        parts = [f"epoch {epoch + 1:>{width}}/{self.epochs}",
                 f"loss {logs.get('loss', float('nan')):.4f}",
                 f"acc {logs.get('accuracy', float('nan')):.4f}"]
        if "eval_accuracy" in logs:
            parts += [f"eval_loss {logs['eval_loss']:.4f}",
                      f"eval_acc {logs['eval_accuracy']:.4f}"]
        parts += [f"lr {logs.get('lr', float('nan')):.4g}",
                  f"{logs.get('samples_per_sec', 0):,.0f} samples/s",
                  f"{logs.get('epoch_seconds', 0):.1f}s"]
        self._print("  ".join(parts))

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


class MetricsLog(tf.keras.callbacks.Callback):
    """Appends one JSON object per epoch to RUN_DIR/metrics.jsonl (rank 0)."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        row = {"epoch": epoch + 1, "time": time.time(),
               **{k: float(v) for k, v in (logs or {}).items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


class Checkpointer(tf.keras.callbacks.Callback):
    """Writes a checkpoint after every epoch, atomically, keeping the last ``keep``.

    Every rank runs it: rank 0 writes, then ``agree`` (a collective) gives rank 0's failure (a
    full or read-only disk) to every rank, so all stop together instead of waiting for rank 0
    in the next all-reduce. The checkpoints already written stay as they were.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, run_dir: Path, keep: int, *,
                 is_chief: bool, agree: Callable[[str | None], None]):
        super().__init__()
        self.checkpoint, self.run_dir, self.keep = checkpoint, run_dir, keep
        self.is_chief, self.agree = is_chief, agree

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        problem = None
        if self.is_chief:
            metrics = {k: float(v) for k, v in (logs or {}).items()}
            try:
                checkpoints.save(self.checkpoint, self.run_dir, epoch + 1,
                                 {"metrics": metrics}, self.keep)
            except checkpoints.WriteFailed as e:
                problem = str(e)
        self.agree(problem)


class StopOnNonFiniteLoss(tf.keras.callbacks.Callback):
    """Stops every rank, before anything of the epoch is written, when the epoch's loss
    (already averaged over ranks, so the same number everywhere) is NaN or infinite."""

    def __init__(self, run_dir: Path):
        super().__init__()
        self.run_dir = run_dir

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        loss = float((logs or {}).get("loss", 0.0))
        if math.isfinite(loss):
            return
        found = checkpoints.latest(self.run_dir)
        kept = (f"the last good checkpoint, {found[1]}, is kept" if found
                else "no checkpoint was written")
        raise UserError(f"training diverged: the loss is {loss} in epoch {epoch + 1}; {kept}: "
                        f"lower optim.lr (or raise optim.warmup_epochs) and resume with "
                        f"--resume", shared=True)


class CommitEachEpoch(tf.keras.callbacks.Callback):
    """Elastic training: at each epoch end, records the epoch and commits ``state`` (weights,
    optimizer, epoch) in memory. A lost worker rolls the others back to this point; a worker
    added waits for it to join."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = epoch + 1
        self.state.commit()  # may raise Horovod's HostsUpdatedInterrupt: the elastic loop resets
