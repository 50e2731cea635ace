"""Batch normalization on TensorFlow's fused kernel, for Keras 3 models.

Keras 3's ``BatchNormalization`` on the TensorFlow backend computes the batch's moments and
normalizes with separate element-wise ops, several passes over every activation forwards and
backwards. Keras 2 (``tf.keras`` on TensorFlow 2.15) called ``FusedBatchNormV3``, one kernel
(oneDNN's on a CPU, cuDNN's on a GPU); a model that normalizes after every convolution, such
as MobileNetV2, pays for the difference (docs/stacks.md, "Speed"). ``fuse_batch_norm``
routes a model's ``BatchNormalization`` layers through the fused kernel, with Keras 3's own
semantics kept: the same output and gradients to float rounding, the
same moving averages (the kernel's batch variance carries Bessel's correction, which Keras 3's
moving variance does not), the same variables, config and saved file. A call the kernel cannot
serve (not 4-D channels-last, a mask, renorm, synchronized) takes Keras's own path.
"""
from __future__ import annotations

import types
from typing import Any

import tensorflow as tf

from hvdtrain.keras_version import keras_major


def keras3_on_tensorflow() -> bool:
    """Keras 3 computing with TensorFlow (not with another backend KERAS_BACKEND names)."""
    return keras_major() == 3 and tf.keras.config.backend() == "tensorflow"


def fuse_batch_norm(model: tf.keras.Model) -> int:
    """Every plain ``BatchNormalization`` in ``model`` (nested ones included) computes with the
    fused kernel from now on; returns how many. Keras 2 fuses by itself: 0 there. Subclasses of
    ``BatchNormalization`` keep their own ``call``. Call it before the first training step
    (``fit`` traces its step then), built or not: the layers exist once the model is made."""
    if not keras3_on_tensorflow():
        return 0
    count = 0
    # Keras 3's own walk over a model's layers, nested models and a layer's sublayers included.
    for layer in model._flatten_layers(include_self=False):
        if type(layer) is tf.keras.layers.BatchNormalization and "call" not in vars(layer):
            # On the instance, not the class: the layer's class, config and saved file stay
            # Keras's own, so a model saved from here loads anywhere.
            object.__setattr__(layer, "call", types.MethodType(_fused_call, layer))
            count += 1
    return count


def fuse_every_batch_norm(on: bool = True) -> None:
    """From now on every plain ``BatchNormalization`` (made before or after) computes with the
    fused kernel, as Keras 2's did; ``on`` False gives them Keras's own ``call`` back. For
    scripts whose models hvdtrain does not build (Horovod's, through ``hvdtrain.horovod``).
    The class keeps its name and config: a saved model loads anywhere. Keras 2: nothing."""
    if not keras3_on_tensorflow():
        return
    keras_class = tf.keras.layers.BatchNormalization
    own = vars(keras_class).get("hvdtrain_keras_call")
    if on and own is None:
        keras_class.hvdtrain_keras_call = keras_class.call

        def call(self: Any, inputs: tf.Tensor, training: Any = None, mask: Any = None) -> Any:
            if type(self) is not keras_class:   # a subclass's own semantics stay its own
                return keras_class.hvdtrain_keras_call(self, inputs, training=training,
                                                       mask=mask)
            return _fused_call(self, inputs, training, mask)

        keras_class.call = call
    elif not on and own is not None:
        keras_class.call = own
        del keras_class.hvdtrain_keras_call


def _keras_call(layer: Any) -> Any:
    """Keras's own ``call`` of ``layer``'s class, also where fuse_every_batch_norm replaced it."""
    return getattr(type(layer), "hvdtrain_keras_call", type(layer).call)


def _fused_call(layer: Any, inputs: tf.Tensor, training: Any = None,
                mask: Any = None) -> tf.Tensor:
    rank = len(inputs.shape)
    if (rank != 4 or layer.axis not in (3, -1) or mask is not None or layer.renorm
            or layer.synchronized):
        return _keras_call(layer)(layer, inputs, training=training, mask=mask)
    # As Keras 3 does: float32 statistics whatever the compute dtype, the output in it.
    x = tf.cast(inputs, tf.float32)
    gamma = layer.gamma if layer.scale else tf.ones_like(layer.moving_mean)
    beta = layer.beta if layer.center else tf.zeros_like(layer.moving_mean)
    if training and layer.trainable:
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            x, gamma, beta, epsilon=layer.epsilon, data_format="NHWC", is_training=True)
        # The kernel returns the unbiased batch variance (n / (n - 1) times the biased one);
        # Keras 3 averages the biased one into its moving variance.
        n = tf.cast(tf.size(x) // tf.shape(x)[-1], tf.float32)
        variance = tf.where(n > 1.0, variance * (n - 1.0) / n, tf.zeros_like(variance))
        momentum = layer.momentum
        layer.moving_mean.assign(layer.moving_mean * momentum + mean * (1.0 - momentum))
        layer.moving_variance.assign(layer.moving_variance * momentum
                                     + variance * (1.0 - momentum))
    else:
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x, gamma, beta, mean=layer.moving_mean, variance=layer.moving_variance,
            epsilon=layer.epsilon, data_format="NHWC", is_training=False)
    return tf.cast(y, layer.compute_dtype)
