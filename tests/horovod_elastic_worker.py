"""Launched by tests/multirank/test_horovod_elastic.py under horovodrun's elastic mode: Horovod's
Keras elastic example (examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py, v0.28.1)
as its users write it, on scikit-learn's digits, through ``import hvdtrain.horovod.tensorflow.keras
as hvd``. Each rank writes its final weights, the state's epoch and the world size to
OUT/rankR.npz. With LOSE, the rank of the first world alone on its host exits at the first
epoch's sixth step, before that step's all-reduce, so the others lose it inside their train
function. Alone, because Horovod blacklists the host of a failed worker and ends its other
workers, and horovodrun does not keep the order of the hosts: that rank is 0 in some runs.

    python tests/horovod_elastic_worker.py OUT EPOCHS [LOSE]
"""
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import hvdtrain.horovod.tensorflow.keras as hvd

hvd.init()
out, epochs = Path(sys.argv[1]), int(sys.argv[2])
x, y = load_digits(return_X_y=True)
dataset = (tf.data.Dataset.from_tensor_slices(((x / 16).astype("float32"), y)).repeat()
           .shuffle(1000, seed=hvd.rank()).batch(32))
tf.keras.utils.set_random_seed(hvd.rank())   # only rank 0's state, synced, may count
model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10)])
lr = 0.05
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(lr * hvd.size(), momentum=0.9))
model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              optimizer=opt, metrics=["accuracy"], jit_compile=False)


def on_state_reset():
    # Keras 3's own change: tf.keras.backend.set_value fails on a Keras 3 variable.
    state.model.optimizer.learning_rate.assign(lr * hvd.size())


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([on_state_reset])
callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state)]
first_size = hvd.size()


class LoseTheRankAloneOnItsHost(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if hvd.size() == first_size and hvd.local_size() == 1 and state.epoch == 0 \
                and batch == 5:
            os._exit(1)


if sys.argv[3:] == ["LOSE"]:
    callbacks.append(LoseTheRankAloneOnItsHost())


@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=20, epochs=epochs - state.epoch, callbacks=callbacks,
                    verbose=2 if hvd.rank() == 0 else 0)


train(state)
np.savez(out / f"rank{hvd.rank()}.npz", epoch=state.epoch, size=hvd.size(), *model.get_weights())
