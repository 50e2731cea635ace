"""hvdtrain.models.fused_norm: a Keras 3 model's BatchNormalization on TensorFlow's fused kernel
trains to the same weights and moving statistics as Keras's own, saves as Keras's own layer, and is
what registry.build gives; on Keras 2, which fuses by itself, it leaves the layers alone. Which
stack runs is read from the installed package (stack.keras3), not from fused_norm."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import largest_difference
from stack import keras3

from hvdtrain.models import fused_norm, registry
from hvdtrain.config import ModelConfig

layers = tf.keras.layers
SHAPE = (6, 6, 3)
FUSED_OP = "FusedBatchNormV3"


def _model() -> tf.keras.Model:
    """Conv + BN (default, and without scale or center), and a BN on a 2-D tensor, which the
    fused kernel cannot serve (Keras's own path)."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(SHAPE)
    x = layers.Conv2D(4, 3, padding="same")(inputs)
    x = layers.ReLU()(layers.BatchNormalization(momentum=0.8)(x))
    x = layers.BatchNormalization(center=False, scale=False)(layers.Conv2D(5, 3)(x))
    x = layers.Dense(6)(layers.GlobalAveragePooling2D()(x))
    x = layers.BatchNormalization()(x)
    return tf.keras.Model(inputs, layers.Dense(3)(x))


def _data(n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (rng.normal(2.0, 3.0, (n, *SHAPE)).astype(np.float32),
            rng.integers(0, 3, n))


def _train(model: tf.keras.Model, epochs: int) -> list[np.ndarray]:
    model.compile(tf.keras.optimizers.SGD(0.05),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


def _op_types(model: tf.keras.Model, shape=SHAPE) -> set[str]:
    step = tf.function(lambda x: model(x, training=True))
    graph = step.get_concrete_function(tf.TensorSpec((2, *shape), tf.float32)).graph
    return {op.type for op in graph.get_operations()}


@pytest.mark.keras3_only
def test_fused_training_gives_keras_own_weights_and_moving_statistics():
    plain, fused = _model(), _model()
    assert fused_norm.fuse_batch_norm(fused) == 3
    assert fused_norm.fuse_batch_norm(fused) == 0           # once per layer
    assert FUSED_OP in _op_types(fused) and FUSED_OP not in _op_types(plain)
    reference, candidate = _train(plain, epochs=3), _train(fused, epochs=3)
    # Weights, gammas, betas, moving means and variances, after 12 steps.
    assert largest_difference(reference, candidate) < 1e-4
    # Control: one step more of the same training moves the weights well past the tolerance.
    assert largest_difference(reference, _train(_model(), epochs=4)) > 1e-2


@pytest.mark.keras3_only
def test_fused_inference_and_mixed_precision_match_keras_own():
    x, _ = _data(4)
    plain, fused = _model(), _model()
    fused_norm.fuse_batch_norm(fused)
    _train(plain, 1), _train(fused, 1)                      # moving statistics away from 0, 1
    assert np.allclose(plain(x, training=False), fused(x, training=False), atol=1e-4)
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        plain16, fused16 = _model(), _model()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    fused_norm.fuse_batch_norm(fused16)
    out = fused16(x, training=True)
    assert out.dtype == tf.float16
    assert np.allclose(plain16(x, training=True), out, atol=2e-2)


@pytest.mark.keras3_only
def test_fused_model_saves_and_loads_as_keras_own_layers(tmp_path):
    model = _model()
    fused_norm.fuse_batch_norm(model)
    model.save(tmp_path / "m.keras")
    loaded = tf.keras.models.load_model(tmp_path / "m.keras")
    norms = [layer for layer in loaded.layers
             if isinstance(layer, layers.BatchNormalization)]
    assert len(norms) == 3 and all(type(n) is layers.BatchNormalization for n in norms)
    assert not any("call" in vars(n) for n in norms)        # loaded as Keras's own, unfused
    x, _ = _data(4)
    assert np.allclose(model(x, training=False), loaded(x, training=False), atol=1e-6)


@pytest.mark.keras3_only
def test_subclasses_keep_their_call():
    class Mine(layers.BatchNormalization):
        pass
    inputs = tf.keras.Input(SHAPE)
    plain = layers.BatchNormalization()
    mine = Mine()
    model = tf.keras.Model(inputs, mine(plain(inputs)))
    assert fused_norm.fuse_batch_norm(model) == 1
    assert "call" in vars(plain) and "call" not in vars(mine)


def test_each_stack_trains_batch_norm_on_the_fused_kernel():
    plain, model = _model(), _model()
    count = fused_norm.fuse_batch_norm(model)
    replaced = [layer for layer in model.layers if "call" in vars(layer)]
    if keras3():
        # Keras 3's own layer computes with element-wise ops; fused_norm takes all three layers
        # (the kernel serves the two on 4-D tensors).
        assert FUSED_OP not in _op_types(plain)
        assert count == 3 and len(replaced) == 3 and FUSED_OP in _op_types(model)
    else:
        # Keras 2 fuses by itself: fuse_batch_norm leaves every layer as Keras made it.
        assert FUSED_OP in _op_types(plain)
        assert count == 0 and replaced == [] and FUSED_OP in _op_types(model)
        # Control: Keras 2's layer told not to fuse computes without the kernel.
        inputs = tf.keras.Input(SHAPE)
        unfused = tf.keras.Model(inputs, layers.BatchNormalization(fused=False)(inputs))
        assert FUSED_OP not in _op_types(unfused)


@pytest.mark.parametrize("fused", [True, False])
def test_models_build_trains_on_the_fused_kernel_unless_turned_off(fused):
    model = registry.build(ModelConfig(name="resnet_small", width=8, fused_batch_norm=fused),
                         (8, 8, 3), 4)
    # Keras 2 (TensorFlow 2.15) fuses by itself, whatever the config; on Keras 3 it decides.
    expected = fused or not keras3()
    assert (FUSED_OP in _op_types(model, (8, 8, 3))) == expected


@pytest.mark.keras3_only
def test_a_model_fused_before_it_is_built_trains_on_the_fused_kernel():
    # The library's other pattern: a Sequential without an Input, built by its first step.
    model = tf.keras.Sequential([layers.Conv2D(4, 3), layers.BatchNormalization(),
                                 layers.Flatten(), layers.Dense(3)])
    assert fused_norm.fuse_batch_norm(model) == 1
    _train(model, epochs=1)
    assert FUSED_OP in _op_types(model)


@pytest.fixture
def every_batch_norm_fused():
    fused_norm.fuse_every_batch_norm()
    yield
    fused_norm.fuse_every_batch_norm(False)


@pytest.mark.keras3_only
def test_every_batch_norm_fused_trains_as_keras_own_and_can_be_undone(every_batch_norm_fused):
    # For models hvdtrain does not build (a Horovod script's, through hvdtrain.horovod's init).
    fused = _model()
    assert FUSED_OP in _op_types(fused)
    assert type(fused.layers[2]) is layers.BatchNormalization   # the class stays Keras's own
    candidate = _train(fused, epochs=3)
    fused_norm.fuse_every_batch_norm(False)
    plain = _model()
    assert FUSED_OP not in _op_types(plain)   # control: undone, Keras's own path again
    assert largest_difference(_train(plain, epochs=3), candidate) < 1e-4


@pytest.mark.keras3_only
def test_every_batch_norm_fused_leaves_a_subclass_its_own_call(every_batch_norm_fused):
    class Own(layers.BatchNormalization):
        pass

    inputs = tf.keras.Input(SHAPE)
    model = tf.keras.Model(inputs, Own()(layers.Conv2D(4, 3)(inputs)))
    assert FUSED_OP not in _op_types(model)
