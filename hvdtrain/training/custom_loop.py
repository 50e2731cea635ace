"""The custom training loop (``train.loop = custom``): a ``tf.function`` step whose gradients go
through ``dist.distributed_tape`` (Horovod's ``DistributedGradientTape`` on Keras 2,
hvdtrain's own reducing tape on Keras 3), for users who outgrow Keras ``fit``.

``hvdtrain train --loop custom`` drives it with the same sharding, LR schedule, callbacks,
checkpoints and summary as ``fit``. As a library, bring your own loss::

    from hvdtrain.training import custom_loop
    from hvdtrain import distributed as dist
    world = dist.init(options=cfg.horovod)
    step = custom_loop.TrainStep(model, optimizer, cfg.horovod, loss_fn=my_loss)
    for x, y in my_shard:                      # every rank the same number of batches,
        loss_sum, correct, count = step(x, y)  # or horovod.join_uneven and step.finish()
    step.finish()

``my_loss(model, x, y)`` returns ``(per-sample losses, logits)``. The optimizer is a plain
Keras optimizer (the tape reduces the gradients), or a ``LossScaleOptimizer`` around one for
mixed precision.
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

from hvdtrain.training import evaluation
from hvdtrain import distributed as dist
from hvdtrain.config import HorovodConfig

LossFn = Callable[[tf.keras.Model, tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


def classification_loss(model: tf.keras.Model, x: tf.Tensor,
                        y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-sample cross-entropy on logits; the logits in float32 even under mixed precision."""
    logits = tf.cast(model(x, training=True), tf.float32)
    return tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True), logits


class TrainStep:
    """``step(x, y)`` trains on one batch of this rank and returns its [loss sum, correct,
    count]. Every rank must call it the same number of times, unless join_uneven is on and
    every rank calls ``finish()`` after its last batch.

    - Gradients are reduced across ranks by ``dist.distributed_tape`` (average or Adasum,
      fp16 compression, sparse_as_dense as configured).
    - With ``backward_passes_per_step`` = k, k batches' gradients are summed locally and
      reduced once: k batches of B per rank make one step of kB per rank.
    - With a ``LossScaleOptimizer``, the SCALED gradients are reduced, then unscaled: every rank
      sees the same (finite or not) gradients, so all skip or apply the same steps.
    - After the first applied step, rank 0's variables and optimizer state reach every rank
      (Horovod's pattern: state created in that step, such as optimizer slots, exists now).
    """

    def __init__(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                 options: HorovodConfig, *, loss_fn: LossFn = classification_loss):
        self.model, self.optimizer, self.options, self.loss_fn = model, optimizer, options, loss_fn
        self.loss_scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        self.k = options.backward_passes_per_step
        self._pending = 0               # batches accumulated since the last applied step
        self._broadcast_done = False
        if self.k == 1:
            self._step = tf.function(self._reduce_and_apply_step)
        else:
            self._accumulated = [tf.Variable(tf.zeros_like(v), trainable=False)
                                 for v in model.trainable_variables]
            self._step = tf.function(self._accumulate_step)
            self._apply = tf.function(self._reduce_and_apply_accumulated)

    def __call__(self, x: tf.Tensor, y: tf.Tensor) -> np.ndarray:
        sums = self._step(x, y)
        self._pending += 1
        if self._pending == self.k:
            self._flush()
        return sums.numpy()

    def finish(self) -> None:
        """After this rank's last batch of an epoch: applies a partial accumulation, and with
        join_uneven waits for every rank, then takes the state of the rank that ran longest."""
        self._flush()
        if self.options.join_uneven:
            last = dist.join()  # Horovod: wait here, answering peers' all-reduces with zeros
            # Horovod: a joined rank skipped the updates of the steps it did not run.
            dist.broadcast_variables(self._state(), root_rank=last)

    # -----------------------------------------------------------------------------------------
    def _flush(self) -> None:
        if self._pending == 0:
            return
        if self.k > 1:
            self._apply(tf.constant(self._pending, tf.float32))
        self._pending = 0
        if not self._broadcast_done:
            dist.broadcast_variables(self._state())  # Horovod: after the first step, see above
            self._broadcast_done = True

    def _state(self) -> list[tf.Variable]:
        return [*self.model.variables, *dist.optimizer_variables(self.optimizer)]

    def _loss(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        losses, logits = self.loss_fn(self.model, x, y)
        loss = tf.reduce_mean(losses)
        if self.model.losses:  # regularization, as Keras fit adds it
            loss += tf.add_n([tf.cast(term, tf.float32) for term in self.model.losses])
        return loss, losses, logits

    def _reduce_and_apply_step(self, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, losses, logits = self._loss(x, y)
            if self.loss_scaled:
                loss = dist.scale_loss(self.optimizer, loss)
        tape = dist.distributed_tape(tape, self.options)  # Horovod: gradients reduced
        grads = tape.gradient(loss, variables)
        self._apply_gradients(grads)
        return evaluation.batch_sums(losses, logits, y)

    def _accumulate_step(self, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:  # local only: nothing crosses the network here
            loss, losses, logits = self._loss(x, y)
            if self.loss_scaled:
                loss = dist.scale_loss(self.optimizer, loss)
        for total, grad in zip(self._accumulated, tape.gradient(loss, variables)):
            total.assign_add(tf.convert_to_tensor(grad))
        return evaluation.batch_sums(losses, logits, y)

    def _reduce_and_apply_accumulated(self, batches: tf.Tensor) -> None:
        mean = [total / batches for total in self._accumulated]
        self._apply_gradients(dist.reduce_gradients(mean, self.options,
                                                      name="hvdtrain_accumulated_gradients"))
        for total in self._accumulated:
            total.assign(tf.zeros_like(total))

    def _apply_gradients(self, grads: list[tf.Tensor]) -> None:
        if self.loss_scaled:
            dist.apply_scaled_gradients(self.optimizer, grads, self.model.trainable_variables)
        else:
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))


def run_epochs(step: TrainStep, batches: Iterator, *, first_epoch: int, epochs: int,
               steps_per_epoch: int, callbacks: list[tf.keras.callbacks.Callback]) -> dict:
    """The outer loop: epochs of ``steps_per_epoch`` batches (this rank's count), driving the
    same Keras callbacks as ``fit`` does. Returns the last epoch's logs. The train loss and
    accuracy are exact over all ranks' samples (sums added across ranks)."""
    hooks = tf.keras.callbacks.CallbackList(callbacks, model=step.model)
    hooks._check_timing = False  # Keras' "callback slow vs batch" warning: noise on tiny steps
    logs: dict = {}
    hooks.on_train_begin()
    for epoch in range(first_epoch, epochs):
        hooks.on_epoch_begin(epoch)
        totals = np.zeros(3, np.float64)
        for batch in range(steps_per_epoch):
            hooks.on_train_batch_begin(batch)
            x, y = next(batches)
            totals += step(x, y)
            hooks.on_train_batch_end(batch, {"loss": totals[0] / totals[2]})
        step.finish()
        loss, accuracy, _ = evaluation.totals(totals)  # exact over all ranks' samples
        logs = {"loss": loss, "accuracy": accuracy}
        hooks.on_epoch_end(epoch, logs)
    hooks.on_train_end(logs)
    return logs
