"""The Keras ``fit`` trainer: build, restore or broadcast, fit, evaluate exactly, export.

It reads no argv or environment: it takes a Config and the World from ``dist.init``.
Rank 0 alone prints and writes; every collective is reached by every rank in the same order.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import numpy as np
import tensorflow as tf

from hvdtrain import (__version__, callbacks, checkpoints, custom_loop, data, dist, hvd_options,
                      models, schedules, sharding)
from hvdtrain.config import Config, to_dict
from hvdtrain.errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Fitted:
    final_logs: dict
    final_eval: dict
    throughput: callbacks.Throughput
    steps: int
    peak_lr: float


@dataclass(frozen=True)
class Prepared:
    dataset: data.DataSet
    model: tf.keras.Model
    optimizer: tf.keras.optimizers.Optimizer
    checkpoint: tf.train.Checkpoint
    run_dir: Path
    start_epoch: int
    restored_metrics: dict


class Trainer:
    def __init__(self, config: Config, world: dist.World, *, resume: bool = False,
                 elastic: bool = False,
                 extra_callbacks: Sequence[tf.keras.callbacks.Callback] = ()):
        self.config, self.world, self.resume, self.elastic = config, world, resume, elastic
        # Run on every rank after hvdtrain's own (e.g. the benchmarks' step timer); they see
        # each epoch's logs with the eval results and throughput already in them.
        self.extra_callbacks = list(extra_callbacks)
        self.model: tf.keras.Model | None = None   # the trained model, once train() returns
        self.world_sizes: list[int] = []  # elastic: the world size of each (re)start

    def say(self, message: str) -> None:
        if self.world.is_chief:
            print(message, flush=True)

    # -----------------------------------------------------------------------------------------
    def train(self) -> dict:
        """Trains to ``train.epochs`` and returns the summary that rank 0 writes to summary.json."""
        started = time.perf_counter()
        cfg = self.config
        if self.elastic:
            p, fitted = self._train_elastic()
        else:
            # Horovod: options this world cannot run (Adasum on 3 ranks) stop every rank up front.
            dist.agree_or_fail(hvd_options.world_problem(cfg.horovod, self.world.size,
                                                         self.world.controller), self.world)
            p = self.prepare()
            fitted = self._fit(p, extra=self.extra_callbacks)
        self.model = p.model
        world, final_logs, final_eval = self.world, fitted.final_logs, fitted.final_eval
        throughput, steps, peak_lr = fitted.throughput, fitted.steps, fitted.peak_lr

        summary = {
            "hvdtrain_version": __version__,
            "preset": cfg.preset,
            "world_size": world.size,
            "controller": world.controller,
            "device": world.device,
            "intra_op_threads": world.intra_op_threads,
            "epochs": cfg.train.epochs,
            "resumed_from_epoch": p.start_epoch if self.resume else None,
            "batch_size_per_rank": cfg.train.batch_size,
            "global_batch_size": cfg.train.batch_size * world.size,
            "steps_per_epoch": steps,
            "peak_lr": peak_lr,
            "model": cfg.model.name,
            "loop": cfg.train.loop,
            "precision": cfg.train.precision,
            "horovod": dataclasses.asdict(cfg.horovod),
            "params": int(p.model.count_params()),
            "data": p.dataset.description,
            "final_train_loss": final_logs.get("loss"),
            "final_train_accuracy": final_logs.get("accuracy"),
            "final_eval_loss": final_eval["eval_loss"],
            "final_eval_accuracy": final_eval["eval_accuracy"],
            "eval_samples": final_eval["eval_samples"],
            "train_seconds": throughput.train_seconds,
            "train_samples_per_sec": (throughput.samples_per_epoch * throughput.epochs_timed
                                      / throughput.train_seconds
                                      if throughput.train_seconds else None),
            "wall_seconds": time.perf_counter() - started,
            "run_dir": str(p.run_dir),
        }
        if self.elastic:
            summary["elastic_world_sizes"] = self.world_sizes
        if world.is_chief:
            if cfg.run.export:
                summary["exported_model"] = str(self._export(p.model, p.run_dir))
            checkpoints.write_json_atomic(p.run_dir / "summary.json", summary)
            self.say(f"done: eval accuracy {final_eval['eval_accuracy']:.4f} on "
                     f"{final_eval['eval_samples']} samples, {summary['wall_seconds']:.1f}s, "
                     f"run dir {p.run_dir}")
        return summary

    def _fit(self, p: Prepared, *, banner: bool = True,
             extra: Sequence[tf.keras.callbacks.Callback] = ()) -> Fitted:
        """Keras ``fit`` or the custom loop (train.loop) from ``p.start_epoch`` on this world's
        shard, with the lr scaled for this world size; ``extra`` callbacks run last, on every
        rank."""
        cfg, world = self.config, self.world
        stream = data.train_dataset(
            p.dataset.train, rank=world.rank, size=world.size, batch_size=cfg.train.batch_size,
            first_epoch=p.start_epoch, epochs=cfg.train.epochs, seed=cfg.train.seed,
            shuffle=cfg.data.shuffle, shuffle_buffer=cfg.data.shuffle_buffer,
            pad=not cfg.horovod.join_uneven)
        steps = stream.steps_per_epoch
        # The schedule counts optimizer updates: one per backward_passes_per_step batches.
        updates = math.ceil(steps / cfg.horovod.backward_passes_per_step)
        peak_lr = schedules.scaled_lr(cfg.optim.lr, world.size, cfg.optim.lr_scaling)
        if banner:
            self._banner(p, steps, peak_lr)

        lr = callbacks.LearningRateSchedule(
            base_lr=cfg.optim.lr, peak_lr=peak_lr,
            warmup_steps=round(cfg.optim.warmup_epochs * updates),
            total_steps=cfg.train.epochs * updates, decay=cfg.optim.decay)
        throughput = callbacks.Throughput(stream.samples_per_epoch * world.size)
        evaluate = self.evaluator(p.model, p.dataset)
        evaluation = callbacks.ExactEvaluation(evaluate, cfg.train.eval_every, cfg.train.epochs)
        # Every rank, in this order: average the epoch's metrics over ranks (a collective), stop
        # all together on a NaN loss, then the exact eval (a collective), then the numbers rank 0
        # reports; last, the checkpoint (rank 0 writes, all agree it worked) and ``extra``.
        # (The custom loop adds the metrics' sums across ranks itself.)
        every_rank = ([dist.metric_average_callback()] if cfg.train.loop == "fit" else []) + [
            callbacks.StopOnNonFiniteLoss(p.run_dir), lr, evaluation, throughput]
        chief_only = [callbacks.ProgressLine(cfg.train.epochs, steps_per_epoch=steps,
                                             global_batch=cfg.train.batch_size * world.size,
                                             every_seconds=cfg.run.progress_every_s),
                      callbacks.MetricsLog(p.run_dir / "metrics.jsonl")]
        if cfg.run.tensorboard:
            chief_only.insert(0, tf.keras.callbacks.TensorBoard(
                str(p.run_dir / "tensorboard"), write_graph=False, profile_batch=0))
        last = [callbacks.Checkpointer(
            p.checkpoint, p.run_dir, cfg.run.keep_checkpoints, is_chief=world.is_chief,
            agree=lambda problem: dist.agree_or_fail(problem, self.world)), *extra]

        # Horovod's stall check is inert under Gloo (it works under MPI): bound the wait here.
        watchdog = (callbacks.StallWatchdog(cfg.run.stall_abort_s, world.rank)
                    if world.controller == "gloo" and world.size > 1 and cfg.run.stall_abort_s
                    else None)
        final_logs = dict(p.restored_metrics)
        hooks = (every_rank + (chief_only if world.is_chief else []) + last
                 + ([watchdog] if watchdog else []))
        if p.start_epoch < cfg.train.epochs:
            try:
                if cfg.train.loop == "custom":
                    final_logs = custom_loop.run_epochs(
                        custom_loop.TrainStep(p.model, p.optimizer, cfg.horovod),
                        iter(stream.dataset), first_epoch=p.start_epoch,
                        epochs=cfg.train.epochs, steps_per_epoch=steps, callbacks=hooks)
                else:
                    history = p.model.fit(
                        stream.dataset, epochs=cfg.train.epochs, initial_epoch=p.start_epoch,
                        steps_per_epoch=steps, verbose=0, callbacks=hooks)
                    final_logs = {k: float(v[-1]) for k, v in history.history.items()}
            finally:
                if watchdog:
                    watchdog.stop()
        else:
            self.say(f"nothing to train: {p.run_dir} is at epoch {p.start_epoch} of "
                     f"{cfg.train.epochs}; raise train.epochs to train further")
        return Fitted(final_logs, evaluation.latest or evaluate(), throughput, steps, peak_lr)

    def _train_elastic(self) -> tuple[Prepared, Fitted]:
        """Elastic training (horovodrun --min-np/--max-np): state is committed in memory at
        every epoch end. When a worker is lost the others roll back to the last commit, and
        when one is added it joins at the next commit; either way training goes on from there
        on the new set of ranks, with the sharding and the learning rate computed for it."""
        # Built on each rank alone: a worker added later must reach no collective before the
        # elastic loop, where the running ranks are syncing state.
        dataset, model, optimizer, checkpoint = self._build(agree=False)
        state = dist.elastic_state(model, optimizer, epoch=0, run_dir="")

        def open_or_continue() -> tuple[str, int, dict]:
            if state.run_dir:  # a restart: the run is open, go on from the last commit
                return state.run_dir, state.epoch, {}
            run_dir = Path(self._default_run_dir())
            return (str(run_dir), *self._open_run_dir(run_dir, checkpoint))

        @dist.run_elastic
        def train_on_current_ranks(state) -> tuple[Prepared, Fitted]:
            # Every rank, old or new, runs these collectives in the same order on each start.
            self.world = dist.refresh_world(self.world)
            dist.check_same_config(to_dict(self.config), self.world)
            # Horovod: options this world size cannot run stop every rank (before any commit).
            dist.agree_or_fail(hvd_options.world_problem(
                self.config.horovod, self.world.size, self.world.controller), self.world)
            run_dir, start_epoch, restored = self._on_chief(open_or_continue)
            # Horovod: rank 0's weights and optimizer state (a restored checkpoint or the last
            # commit) on every rank.
            dist.broadcast_variables(model.variables + list(optimizer.variables()))
            state.run_dir, state.epoch = run_dir, start_epoch
            state.save()
            p = Prepared(dataset, model, optimizer, checkpoint, Path(run_dir), start_epoch,
                         restored)
            first = not self.world_sizes
            if not first:
                o = self.config.optim
                self.say(f"elastic: now {self.world.size} ranks (was {self.world_sizes[-1]}), "
                         f"going on from epoch {start_epoch + 1}, peak lr "
                         f"{schedules.scaled_lr(o.lr, self.world.size, o.lr_scaling):g}")
            self.world_sizes.append(self.world.size)
            return p, self._fit(p, banner=first, extra=[callbacks.CommitEachEpoch(state),
                                                              *self.extra_callbacks])

        return train_on_current_ranks(state)

    # -----------------------------------------------------------------------------------------
    def prepare(self) -> Prepared:
        """Data, model and optimizer on every rank; the run directory checked and the resume
        point restored by rank 0; then rank 0's state broadcast to all."""
        dataset, model, optimizer, checkpoint = self._build()
        run_dir = Path(self._on_chief(self._default_run_dir))
        start_epoch, restored = self._on_chief(lambda: self._open_run_dir(run_dir, checkpoint))
        # Horovod: every rank starts from rank 0's weights and optimizer state (fresh or restored).
        dist.broadcast_variables(model.variables + list(optimizer.variables()))
        return Prepared(dataset, model, optimizer, checkpoint, run_dir, start_epoch, restored)

    def evaluate_checkpoint(self, run_dir: Path) -> dict:
        """``hvdtrain eval``: the latest checkpoint of ``run_dir`` on the whole eval set."""
        dataset, model, optimizer, checkpoint = self._build()

        def restore_latest() -> int:
            found = checkpoints.latest(run_dir)
            if not found:
                raise UserError(f"{run_dir} holds no checkpoint to evaluate")
            checkpoints.restore(checkpoint, found[1])
            return found[0]
        epoch = self._on_chief(restore_latest)
        dist.broadcast_variables(model.variables)  # Horovod: rank 0 restored; all score it
        return {"epoch": epoch, **self.evaluator(model, dataset)()}

    def _build(self, *, agree: bool = True) -> tuple[
            data.DataSet, tf.keras.Model, tf.keras.optimizers.Optimizer, tf.train.Checkpoint]:
        cfg, world = self.config, self.world
        problem = dataset = model = None
        try:
            dataset = data.load(cfg.data, cfg.train.seed)
            sharding.check_enough_samples(len(dataset.train), world.size)
            tf.keras.utils.set_random_seed(cfg.train.seed)
            # float32, or float16 compute with float32 weights for the layers built next.
            tf.keras.mixed_precision.set_global_policy(cfg.train.precision)
            model = models.build(cfg.model, dataset.input_shape, dataset.num_classes)
        except UserError as e:
            problem = str(e)
        if agree:
            dist.agree_or_fail(problem, world)  # Horovod: all ranks stop together, or none does
        elif problem:
            raise UserError(problem)

        optimizer = self._optimizer()
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
        # Create the optimizer's slots now, so that a restore fills them and a broadcast
        # carries them.
        optimizer.build(model.trainable_variables)
        return dataset, model, optimizer, tf.train.Checkpoint(model=model, optimizer=optimizer)

    def _on_chief(self, work: Callable[[], T]) -> T:
        """Runs ``work`` on rank 0 alone (file system work), then gives its result, or its user
        error, to every rank."""
        result, problem = None, None
        if self.world.is_chief:
            try:
                result = work()
            except UserError as e:
                problem = str(e)
        dist.agree_or_fail(problem, self.world)  # Horovod: rank 0's error stops every rank
        return dist.broadcast_object(result)  # Horovod: rank 0's answer reaches every rank

    def _optimizer(self) -> tf.keras.optimizers.Optimizer:
        o, t = self.config.optim, self.config.train
        if o.name == "sgd":
            base = tf.keras.optimizers.SGD(learning_rate=o.lr, momentum=o.momentum)
        else:
            base = tf.keras.optimizers.Adam(learning_rate=o.lr)
        if t.loop == "fit":
            # Horovod: all-reduce gradients each step
            return dist.distributed_optimizer(base, self.config.horovod)
        # The custom loop's tape reduces the gradients, so its optimizer stays plain.
        if t.precision == "mixed_float16":
            return tf.keras.mixed_precision.LossScaleOptimizer(base)
        return base

    def _default_run_dir(self) -> str:
        if self.config.run.run_dir:
            return self.config.run.run_dir
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return os.path.join("runs", f"{self.config.preset}-{stamp}")

    def _open_run_dir(self, run_dir: Path, checkpoint: tf.train.Checkpoint) -> tuple[int, dict]:
        """Rank 0: refuses to overwrite an earlier run, restores the latest checkpoint when
        resuming, and writes the config. Returns (epochs already done, their last metrics)."""
        found = checkpoints.latest(run_dir)
        if found and not self.resume:
            raise UserError(f"{run_dir} already holds a run (checkpoint after epoch {found[0]}): "
                            f"pass --resume to continue it, or choose another --run-dir")
        if (run_dir / "summary.json").exists() and not self.resume:
            raise UserError(f"{run_dir} already holds a finished run: choose another --run-dir")
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create run dir {run_dir}: {e.strerror}") from None
        if not os.access(run_dir, os.W_OK):
            raise UserError(f"run dir {run_dir} is not writable: choose another --run-dir")
        start_epoch, restored = 0, {}
        if found:
            checkpoints.restore(checkpoint, found[1])
            start_epoch = found[0]
            meta = checkpoints.read_meta(found[1])
            restored = meta.get("metrics", {})
            self.say(f"resuming {run_dir} after epoch {start_epoch} from {found[1].name}")
        elif self.resume:
            self.say(f"no checkpoint in {run_dir} yet: starting at epoch 1")
        checkpoints.write_json_atomic(run_dir / "config.json", to_dict(self.config))
        return start_epoch, restored

    # -----------------------------------------------------------------------------------------
    def evaluator(self, model: tf.keras.Model, dataset: data.DataSet) -> Callable[[], dict]:
        """A function giving loss and accuracy over the WHOLE eval set: each rank sums over its
        disjoint shard, and the sums (not per-rank means) are added across ranks. Every rank
        must call it. The shard and the step are built once and reused at every epoch."""
        shard = data.eval_dataset(dataset.eval, rank=self.world.rank, size=self.world.size,
                                  batch_size=self.config.train.batch_size)

        @tf.function
        def sums_of(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            logits = tf.cast(model(x, training=False), tf.float32)
            losses = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            hits = tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), y)
            return tf.stack([tf.reduce_sum(tf.cast(losses, tf.float64)),
                             tf.reduce_sum(tf.cast(hits, tf.float64)),
                             tf.cast(tf.size(y), tf.float64)])

        def evaluate() -> dict:
            sums = np.zeros(3, np.float64)
            for x, y in shard:
                sums += sums_of(x, y).numpy()
            # Horovod: totals over all ranks.
            loss_sum, correct, count = dist.allreduce_sum(sums)
            return {"eval_loss": loss_sum / count, "eval_accuracy": correct / count,
                    "eval_samples": int(count)}
        return evaluate

    # -----------------------------------------------------------------------------------------
    def _banner(self, p: Prepared, steps: int, peak_lr: float) -> None:
        cfg, w = self.config, self.world
        self.say(
            f"hvdtrain {__version__}: {w.size} rank{'s' if w.size > 1 else ''} ({w.controller}), "
            f"{w.device} x {w.intra_op_threads} threads per rank\n"
            f"  data  {p.dataset.description}\n"
            f"  model {cfg.model.name}, {p.model.count_params():,} parameters\n"
            f"  optim {cfg.optim.name}, lr {cfg.optim.lr:g} per rank -> {peak_lr:g} "
            f"({cfg.optim.lr_scaling} scaling, {cfg.optim.warmup_epochs:g} warmup epochs, "
            f"{cfg.optim.decay})\n"
            f"  batch {cfg.train.batch_size} per rank, {cfg.train.batch_size * w.size} global, "
            f"{steps} steps per epoch, epochs {p.start_epoch + 1}..{cfg.train.epochs}\n"
            f"  loop  {cfg.train.loop}, {cfg.train.precision}{self._horovod_options()}\n"
            f"  horovod {dist.horovod_settings_in_force()}\n"
            f"  run   {p.run_dir}")

    def _horovod_options(self) -> str:
        """The gradient options that differ from the defaults, for the banner."""
        default = type(self.config.horovod)()
        changed = [f"{f.name}={getattr(self.config.horovod, f.name)}"
                   for f in dataclasses.fields(default)
                   if f.name in ("compression", "backward_passes_per_step", "op",
                                 "sparse_as_dense", "join_uneven")
                   and getattr(self.config.horovod, f.name) != getattr(default, f.name)]
        return "".join(f", {c}" for c in changed)

    def _export(self, model: tf.keras.Model, run_dir: Path) -> Path:
        """Rank 0: the trained model as a SavedModel in RUN_DIR/model, swapped in atomically."""
        final = run_dir / "model"
        tmp = run_dir / f".model.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save(str(tmp), include_optimizer=False, save_format="tf")
        if final.exists():
            old = run_dir / f".model.old-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        return final
