"""The models and data of tests/binding_worker.py's cases: a subclassed model whose Dense layer
comes before its Embedding (and, for the CLI, the same on an Input), a Sequential without an
Input, the three-layer model of horovod.bucket_mb's cases, a model with its own train_step, and
each rank's shard of the rows."""
from __future__ import annotations

import numpy as np

SAMPLES, FEATURES, VOCAB, CLASSES = 64, 6, 64, 4


def dense_first_model(num_classes=CLASSES):
    """A subclassed model that creates its Dense layer before its Embedding: its dense
    gradients come before the embedding's sparse one. Where ``skip`` is set (after it is
    built), it skips its Embedding (zeros in its place)."""
    import tensorflow as tf

    class DenseFirst(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.skip = False
            self.dense = tf.keras.layers.Dense(num_classes)
            self.embed = tf.keras.layers.Embedding(VOCAB, 8)
            self.flat = tf.keras.layers.Flatten()

        def call(self, x):
            x = self.flat(x)  # images too, for the CLI
            # Column 0 holds a row's own id: no id twice in a batch, since Keras 3's Adam
            # (measured) updates its second moment per slice, so repeated ids would make the
            # result depend on how the batch is split over ranks.
            ids = tf.cast(x[:, 0], tf.int32) % VOCAB
            embedded = tf.zeros([tf.shape(x)[0], 8]) if self.skip else self.embed(ids)
            return self.dense(tf.concat([x[:, 1:], embedded], axis=1))

    return DenseFirst()


def dense_first_on_input(input_shape, num_classes):
    """The CLI's ``--model binding_worker:dense_first_on_input``: the same model on an Input
    (the CLI needs known shapes); its variables keep their order, the dense ones first."""
    import tensorflow as tf
    inputs = tf.keras.Input(input_shape)
    return tf.keras.Model(inputs, dense_first_model(num_classes)(inputs))


def no_input_model():
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"),
                                tf.keras.layers.Dense(CLASSES)])


# horovod.bucket_mb's cases (both stacks), on bucket_model: 0 (one grouped all-reduce), a bucket
# smaller than any gradient (each its own: 6) and one in between (3: the last layer's three
# gradients, the middle kernel alone, the first layer's two).
BUCKET_CASES = {"buckets_none": 0.0, "buckets_each": 0.00001, "buckets_some": 0.0005}


def bucket_model():
    """Three Dense layers: dense gradients of 384, 64, 1024, 64, 256 and 16 bytes."""
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                tf.keras.layers.Dense(16, activation="relu"),
                                tf.keras.layers.Dense(16, activation="relu"),
                                tf.keras.layers.Dense(CLASSES)])


def data(rank: int, size: int, batch: int):
    """Rank ``rank``'s shard: its B rows of every 2B-row global batch, so 1 rank at 2B sees
    each global batch whole, in the same order."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    x[:, 0] = np.arange(SAMPLES)  # each row's id, for the embedding
    y = rng.integers(0, CLASSES, SAMPLES)
    rows = np.arange(SAMPLES).reshape(-1, size, batch)[:, rank].ravel()
    return x[rows], y[rows]


def own_step_model(optimizers: int):
    """A subclassed model with its own ``train_step`` (a tape, then ``apply_gradients``), with
    one optimizer or, GAN-style, two (one per layer)."""
    import tensorflow as tf
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    class OwnStep(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = tf.keras.layers.Dense(16, activation="relu")
            self.out = tf.keras.layers.Dense(CLASSES)

        def call(self, x):
            return self.out(self.hidden(x))

        def train_step(self, batch):
            x, y = batch
            with tf.GradientTape(persistent=True) as tape:
                value = loss(y, self(x, training=True))
            parts = ([self.trainable_variables] if optimizers == 1 else
                     [self.hidden.trainable_variables, self.out.trainable_variables])
            for optimizer, variables in zip(self.optimizers, parts):
                optimizer.apply_gradients(zip(tape.gradient(value, variables), variables))
            return {"loss": value}

    return OwnStep()
