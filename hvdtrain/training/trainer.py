"""The trainer: build, restore or broadcast, train with Keras ``fit`` or the custom loop,
evaluate exactly, and report.

It reads no argv or environment: it takes a Config and the World from ``dist.init``.
Rank 0 alone prints and writes; every collective is reached by every rank in the same order.
Where the other jobs live: the checks before training in ``preflight``, the callbacks and their
order in ``callbacks.assemble``, the run directory in ``rundir``, the exact metrics in
``evaluation``, the banner and summary.json in ``report``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import tensorflow as tf

from hvdtrain import files, version
from hvdtrain.models import registry
from hvdtrain.training import (callbacks, checkpoints, custom_loop, debug, evaluation, preflight,
                               report, rundir, schedules)
from hvdtrain.data import images, sources
from hvdtrain import distributed as dist
from hvdtrain.config import Config, to_dict
from hvdtrain.errors import UserError


@dataclass(frozen=True)
class TrainingSetup:
    """Everything a run trains with, on every rank, once rank 0's state is everywhere."""
    dataset: sources.DataSet
    model: tf.keras.Model
    optimizer: tf.keras.optimizers.Optimizer
    checkpoint: tf.train.Checkpoint
    run_dir: Path
    start_epoch: int
    restored_metrics: dict


@dataclass(frozen=True)
class TrainingResult:
    final_logs: dict
    final_eval: dict
    throughput: callbacks.Throughput
    steps: int
    peak_lr: float


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
        """Prints ``message`` on rank 0 only, a line at a time: print() of several lines writes
        the last one's newline apart, which mpirun --tag-output would tag (see
        rank_process.whole_lines)."""
        if self.world.is_chief:
            for line in message.splitlines():
                print(line, flush=True)

    # -----------------------------------------------------------------------------------------
    def train(self) -> dict:
        """Trains to ``train.epochs`` and returns the summary that rank 0 writes to summary.json."""
        started = time.perf_counter()
        if self.elastic:
            setup, result = self._train_elastic()
        else:
            setup = self.prepare()
            result = self._run_epochs(setup, extra=self.extra_callbacks)
        self.model = setup.model
        debug.log_weights(setup.model, self.world.rank)
        summary = report.summary(
            self.config, self.world,
            resumed_from_epoch=setup.start_epoch if self.resume else None, steps=result.steps,
            peak_lr=result.peak_lr, params=int(setup.model.count_params()),
            data=setup.dataset.description, final_logs=result.final_logs,
            final_eval=result.final_eval, train_seconds=result.throughput.train_seconds,
            samples_trained=result.throughput.samples_per_epoch * result.throughput.epochs_timed,
            wall_seconds=time.perf_counter() - started,
            buckets_mb=dist.buckets_in_force(self.config.horovod), run_dir=str(setup.run_dir),
            hvdtrain=version.describe())
        if self.elastic:
            summary["elastic_world_sizes"] = self.world_sizes
        if self.world.is_chief:
            if self.config.run.export:
                summary["exported_model"] = str(rundir.export(
                    setup.model, setup.run_dir, class_names=setup.dataset.names()))
            files.write_json_atomic(setup.run_dir / "summary.json", summary)
            self.say(f"done: eval accuracy {result.final_eval['eval_accuracy']:.4f} on "
                     f"{result.final_eval['eval_samples']} samples, "
                     f"{summary['wall_seconds']:.1f}s, run dir {setup.run_dir}")
        return summary

    def prepare(self) -> TrainingSetup:
        """The checks before training, then data, model and optimizer on every rank; the run
        directory checked and the resume point restored by rank 0; then rank 0's state
        broadcast to all."""
        dataset = preflight.check(self.config, self.world, self._load_data)
        model, optimizer, checkpoint = self._build(dataset)
        run_dir = Path(dist.rank0_then_all(lambda: rundir.default_run_dir(self.config),
                                           self.world))
        start_epoch, restored = dist.rank0_then_all(
            lambda: self._open_run_dir(run_dir, checkpoint, dataset), self.world)
        # Horovod: every rank starts from rank 0's weights and optimizer state (fresh or restored).
        dist.broadcast_variables([*model.variables, *dist.optimizer_variables(optimizer)])
        return TrainingSetup(dataset, model, optimizer, checkpoint, run_dir, start_epoch,
                             restored)

    def evaluate_checkpoint(self, run_dir: Path) -> dict:
        """``hvdtrain eval``: the latest checkpoint of ``run_dir`` on the whole eval set."""
        dist.check_same_config(to_dict(self.config), self.world)
        problem, dataset = None, None
        try:
            dataset = self._load_data()
        except UserError as e:
            problem = str(e)
        dist.agree_or_fail(problem, self.world)  # Horovod: all ranks stop together, or none
        assert dataset is not None  # loaded: no rank had a problem
        model, optimizer, checkpoint = self._build(dataset)

        def restore_latest() -> int:
            found = checkpoints.latest(run_dir)
            if not found:
                raise UserError(f"{run_dir} holds no checkpoint to evaluate")
            checkpoints.restore(checkpoint, found[1])
            return found[0]
        epoch = dist.rank0_then_all(restore_latest, self.world)
        dist.broadcast_variables(model.variables)  # Horovod: rank 0 restored; all score it
        return {"epoch": epoch, **self._evaluator(model, dataset)()}

    # -----------------------------------------------------------------------------------------
    def _run_epochs(self, setup: TrainingSetup, *, banner: bool = True,
                    extra: Sequence[tf.keras.callbacks.Callback] = ()) -> TrainingResult:
        """Keras ``fit`` or the custom loop (train.loop) from ``setup.start_epoch`` on this
        world's shard, with the lr scaled for this world size; ``extra`` callbacks run last,
        on every rank."""
        cfg, world = self.config, self.world
        stream = sources.train_dataset(
            setup.dataset.train, rank=world.rank, size=world.size,
            batch_size=cfg.train.batch_size, first_epoch=setup.start_epoch,
            epochs=cfg.train.epochs, seed=cfg.train.seed, shuffle=cfg.data.shuffle,
            shuffle_buffer=cfg.data.shuffle_buffer, pad=not cfg.horovod.join_uneven)
        steps = stream.steps_per_epoch
        peak_lr = self._peak_lr(world.size)
        if banner:
            self.say(report.banner(
                cfg, world, data=setup.dataset.description,
                params=setup.model.count_params(), steps=steps, peak_lr=peak_lr,
                start_epoch=setup.start_epoch, horovod_in_force=dist.horovod_settings_in_force(),
                buckets_mb=dist.buckets_in_force(cfg.horovod), run_dir=str(setup.run_dir),
                hvdtrain=version.describe()))
        evaluate = self._evaluator(setup.model, setup.dataset)
        hooks = callbacks.assemble(
            cfg, world, run_dir=setup.run_dir, checkpoint=setup.checkpoint, steps=steps,
            samples_per_epoch=stream.samples_per_epoch, peak_lr=peak_lr, evaluate=evaluate,
            # The custom loop adds its metrics' sums across ranks itself.
            metric_average=dist.metric_average_callback() if cfg.train.loop == "fit" else None,
            # Before the eval, each checkpoint and the export: the same statistics everywhere.
            statistics_average=dist.statistics_average_callback(),
            agree=lambda problem: dist.agree_or_fail(problem, self.world),
            # Ranks that drift apart, whatever the cause, stop every rank with one line.
            consistency=(dist.ConsistencyCheck(optimizer=setup.optimizer)
                         if cfg.train.consistency_check else None), extra=extra)
        final_logs = dict(setup.restored_metrics)
        if setup.start_epoch >= cfg.train.epochs:
            self.say(f"nothing to train: {setup.run_dir} is at epoch {setup.start_epoch} of "
                     f"{cfg.train.epochs}; raise train.epochs to train further")
        else:
            try:
                final_logs = self._loop(setup, stream, hooks.callbacks)
            except tf.errors.InvalidArgumentError:
                # data.verify_images off: a corrupt image fails the rank that reads it; name it.
                problem = images.read_problem(setup.dataset.train, world.rank, world.size)
                if problem:
                    raise UserError(problem) from None
                raise
            finally:
                if hooks.watchdog:
                    hooks.watchdog.stop()
        return TrainingResult(final_logs, hooks.evaluation.latest or evaluate(),
                              hooks.throughput, steps, peak_lr)

    def _loop(self, setup: TrainingSetup, stream: sources.TrainStream,
              hooks: list[tf.keras.callbacks.Callback]) -> dict:
        """The epochs themselves: Keras ``fit`` or the custom loop. Returns the last logs."""
        cfg = self.config
        if cfg.train.loop == "custom":
            return custom_loop.run_epochs(
                custom_loop.TrainStep(setup.model, setup.optimizer, cfg.horovod),
                iter(stream.dataset), first_epoch=setup.start_epoch, epochs=cfg.train.epochs,
                steps_per_epoch=stream.steps_per_epoch, callbacks=hooks)
        history = setup.model.fit(
            stream.dataset, epochs=cfg.train.epochs, initial_epoch=setup.start_epoch,
            steps_per_epoch=stream.steps_per_epoch, verbose=0, callbacks=hooks,
            shuffle=False)  # each rank's stream is already shuffled (see sources.train_dataset)
        return {k: float(v[-1]) for k, v in history.history.items()}

    def _train_elastic(self) -> tuple[TrainingSetup, TrainingResult]:
        """Elastic training (horovodrun --min-np/--max-np): state is committed in memory at
        every epoch end. When a worker is lost the others roll back to the last commit, and
        when one is added it joins at the next commit; either way training goes on from there
        on the new set of ranks, with the sharding and the learning rate computed for it."""
        # Built on each rank alone: a worker added later must reach no collective before the
        # elastic loop, where the running ranks are syncing state.
        dataset = self._load_data()
        model, optimizer, checkpoint = self._build(dataset, agree=False)
        state = dist.elastic_state(model, optimizer, epoch=0, run_dir="")

        def open_or_continue() -> tuple[str, int, dict]:
            if state.run_dir:  # a restart: the run is open, go on from the last commit
                return state.run_dir, state.epoch, {}
            run_dir = Path(rundir.default_run_dir(self.config))
            return (str(run_dir), *self._open_run_dir(run_dir, checkpoint, dataset))

        @dist.run_elastic
        def train_on_current_ranks(state) -> tuple[TrainingSetup, TrainingResult]:
            # Every rank, old or new, runs these collectives in the same order on each start.
            self.world = dist.refresh_world(self.world)
            preflight.check(self.config, self.world, lambda: dataset)
            run_dir, start_epoch, restored = dist.rank0_then_all(open_or_continue, self.world)
            # Horovod: rank 0's weights and optimizer state (a restored checkpoint or the last
            # commit) on every rank.
            dist.broadcast_variables([*model.variables, *dist.optimizer_variables(optimizer)])
            state.run_dir, state.epoch = run_dir, start_epoch
            state.save()
            setup = TrainingSetup(dataset, model, optimizer, checkpoint, Path(run_dir),
                                  start_epoch, restored)
            first = not self.world_sizes
            if not first:
                self.say(f"elastic: now {self.world.size} ranks (was {self.world_sizes[-1]}), "
                         f"going on from epoch {start_epoch + 1}, peak lr "
                         f"{self._peak_lr(self.world.size):g}")
            self.world_sizes.append(self.world.size)
            return setup, self._run_epochs(setup, banner=first, extra=[
                callbacks.CommitEachEpoch(state), *self.extra_callbacks])

        return train_on_current_ranks(state)

    # -----------------------------------------------------------------------------------------
    def _peak_lr(self, world_size: int) -> float:
        """The lr after warmup at this world size, by the scaling rule in force."""
        o = self.config.optim
        rule = schedules.scaling_in_force(o.lr_scaling, self.config.horovod.op)
        return schedules.scaled_lr(o.lr, world_size, rule)

    def _load_data(self) -> sources.DataSet:
        return sources.load(self.config.data, self.config.train.seed)

    def _build(self, dataset: sources.DataSet, *, agree: bool = True) -> tuple[
            tf.keras.Model, tf.keras.optimizers.Optimizer, tf.train.Checkpoint]:
        """Model and optimizer, compiled, with the optimizer's slots created, so that a restore
        fills them and a broadcast carries them."""
        cfg, problem, model = self.config, None, None
        try:
            tf.keras.utils.set_random_seed(cfg.train.seed)
            # float32, or float16 compute with float32 weights for the layers built next.
            tf.keras.mixed_precision.set_global_policy(cfg.train.precision)
            model = registry.build(cfg.model, dataset.input_shape, dataset.num_classes)
        except UserError as e:
            problem = str(e)
        if agree:
            dist.agree_or_fail(problem, self.world)  # Horovod: all ranks stop together, or none
        elif problem:
            raise UserError(problem)
        assert model is not None  # built: no rank had a problem
        optimizer = self._optimizer()
        registry.compile_classifier(model, optimizer)
        optimizer.build(model.trainable_variables)
        return model, optimizer, tf.train.Checkpoint(model=model, optimizer=optimizer)

    def _optimizer(self) -> tf.keras.optimizers.Optimizer:
        t = self.config.train
        base = registry.base_optimizer(self.config.optim)
        if t.loop == "fit":
            # Horovod: all-reduce gradients each step
            return dist.distributed_optimizer(base, self.config.horovod)
        # The custom loop's tape reduces the gradients, so its optimizer stays plain.
        if t.precision == "mixed_float16":
            return tf.keras.mixed_precision.LossScaleOptimizer(base)
        return base

    def _open_run_dir(self, run_dir: Path, checkpoint: tf.train.Checkpoint,
                      dataset: sources.DataSet) -> tuple[int, dict]:
        return rundir.open_run_dir(run_dir, checkpoint, self.config, resume=self.resume,
                                   say=self.say, class_names=dataset.names())

    def _evaluator(self, model: tf.keras.Model, dataset: sources.DataSet) -> Callable[[], dict]:
        return evaluation.exact_evaluator(model, dataset.eval, self.world,
                                          self.config.train.batch_size)
