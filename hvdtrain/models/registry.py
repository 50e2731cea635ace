"""Model registry: name -> builder(input_shape, num_classes, cfg) returning an uncompiled Keras
model that outputs logits. A registered model is a row of ``hvdtrain/config/model_catalog.py``
(its name and the input it takes) and its function here, of the same name, marked
``@registered``. Users add their own as ``package.module:function``."""
from __future__ import annotations

import importlib
import math
from typing import Callable

import tensorflow as tf

from hvdtrain.models import fused_norm
from hvdtrain.config import ModelConfig, OptimConfig, model_catalog
from hvdtrain.config.checks import suggest
from hvdtrain.errors import UserError

layers = tf.keras.layers
Builder = Callable[[tuple[int, ...], int, ModelConfig], tf.keras.Model]
_BUILDERS: dict[str, Builder] = {}


def registered(builder: Builder) -> Builder:
    """Marks ``builder`` as the function of the catalog's row of its name."""
    _BUILDERS[builder.__name__] = builder
    return builder


@registered
def mlp(input_shape: tuple[int, ...], num_classes: int, cfg: ModelConfig) -> tf.keras.Model:
    """Flatten, two ReLU Dense layers (2 x width, width), then the classifier head: logits
    [batch, num_classes]."""
    inputs = tf.keras.Input(input_shape)
    x = layers.Flatten()(inputs)
    x = layers.Dense(cfg.width * 2, activation="relu")(x)
    x = layers.Dense(cfg.width, activation="relu")(x)
    return _classifier(inputs, x, num_classes, cfg, "mlp")


@registered
def cnn(input_shape: tuple[int, ...], num_classes: int, cfg: ModelConfig) -> tf.keras.Model:
    """A small CNN for digit-sized images (8x8 up to 28x28, one or three channels)."""
    filters = max(8, cfg.width // 2)
    inputs = tf.keras.Input(input_shape)
    x = layers.Conv2D(filters, 3, padding="same", activation="relu")(inputs)
    x = layers.Conv2D(filters * 2, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)  # small images: keep where each feature is, unlike global pooling
    x = layers.Dense(cfg.width, activation="relu")(x)
    return _classifier(inputs, x, num_classes, cfg, "cnn")


@registered
def resnet_small(input_shape: tuple[int, ...], num_classes: int,
                 cfg: ModelConfig) -> tf.keras.Model:
    """A ResNet-style CNN for 32x32x3 (CIFAR-sized): three stages of two residual blocks."""
    inputs = tf.keras.Input(input_shape)
    x = _conv_bn(inputs, cfg.width, 3, 1)
    for stage, filters in enumerate((cfg.width, cfg.width * 2, cfg.width * 4)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _residual_block(x, filters, stride)
    x = layers.GlobalAveragePooling2D()(x)
    return _classifier(inputs, x, num_classes, cfg, "resnet_small")


@registered
def embedding(input_shape: tuple[int, ...], num_classes: int,
              cfg: ModelConfig) -> tf.keras.Model:
    """Each input value, quantized to one of 16 levels at its position, is a token looked up in
    an embedding table: a model whose gradients are sparse (tf.IndexedSlices), for
    horovod.sparse_as_dense. Inputs are expected in [0, 1]."""
    positions, levels = math.prod(input_shape), 16
    inputs = tf.keras.Input(input_shape)
    tokens = PositionTokens(levels)(layers.Flatten()(inputs))
    x = layers.Embedding(positions * levels, max(4, cfg.width // 8))(tokens)
    x = layers.Flatten()(x)
    x = layers.Dense(cfg.width, activation="relu")(x)
    return _classifier(inputs, x, num_classes, cfg, "embedding")


@tf.keras.utils.register_keras_serializable(package="hvdtrain")
class PositionTokens(tf.keras.layers.Layer):
    """Values in [0, 1] quantized to ``levels`` levels, as a token per (position, level):
    token = position * levels + level, one embedding row per pair. A layer class rather than a
    Lambda, so that an exported model loads back (Keras 3 refuses to load Python lambdas)."""

    def __init__(self, levels: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.levels = levels

    def call(self, values: tf.Tensor) -> tf.Tensor:
        level = tf.cast(tf.round(tf.clip_by_value(tf.cast(values, tf.float32), 0.0, 1.0)
                                 * (self.levels - 1)), tf.int32)
        return level + tf.range(tf.shape(values)[-1], dtype=tf.int32) * self.levels

    def get_config(self) -> dict:
        return {**super().get_config(), "levels": self.levels}


def _conv_bn(x: tf.Tensor, filters: int, kernel: int, stride: int,
             relu: bool = True) -> tf.Tensor:
    x = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    return layers.ReLU()(x) if relu else x


def _residual_block(x: tf.Tensor, filters: int, stride: int) -> tf.Tensor:
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, stride, relu=False)
    y = _conv_bn(x, filters, 3, stride)
    y = _conv_bn(y, filters, 3, 1, relu=False)
    return layers.ReLU()(layers.Add()([shortcut, y]))


@registered
def mobilenetv2(input_shape: tuple[int, ...], num_classes: int,
                cfg: ModelConfig) -> tf.keras.Model:
    """Keras's MobileNetV2 application."""
    return _keras_application(tf.keras.applications.MobileNetV2, input_shape, num_classes)


@registered
def resnet50(input_shape: tuple[int, ...], num_classes: int, cfg: ModelConfig) -> tf.keras.Model:
    """Keras's ResNet50 application."""
    return _keras_application(tf.keras.applications.ResNet50, input_shape, num_classes)


def _keras_application(constructor: Callable[..., tf.keras.Model], input_shape: tuple[int, ...],
                       num_classes: int) -> tf.keras.Model:
    # weights=None: random init (nothing to download); logits out, like every model here.
    return constructor(input_shape=input_shape, weights=None, classes=num_classes,
                       classifier_activation=None)


def _classifier(inputs: tf.Tensor, x: tf.Tensor, num_classes: int, cfg: ModelConfig,
                name: str) -> tf.keras.Model:
    if cfg.dropout:
        x = layers.Dropout(cfg.dropout)(x)
    return tf.keras.Model(inputs, layers.Dense(num_classes)(x), name=name)


def _need_image(input_shape: tuple[int, ...], model: str, min_side: int) -> None:
    if len(input_shape) != 3 or min(input_shape[:2]) < min_side:
        raise UserError(f"model {model} needs images of shape height,width,channels with sides "
                        f">= {min_side}, got input shape {input_shape}: choose another model "
                        f"(mlp takes any shape) or reshape the data")


def unmatched(names: list[str], builders: dict[str, Builder]) -> list[str]:
    """The catalog's ``names`` without a builder and the ``builders`` without a row."""
    return [n for n in names if n not in builders] + [n for n in builders if n not in names]


# The catalog's rows, in its order, each with its builder: a row without one, or a builder
# without a row, fails this module's import.
assert not unmatched(model_catalog.names(), _BUILDERS), (
    f"hvdtrain/config/model_catalog.py and the @registered builders differ: "
    f"{unmatched(model_catalog.names(), _BUILDERS)}")
REGISTRY: dict[str, Builder] = {name: _BUILDERS[name] for name in model_catalog.names()}
MIN_SIDE = {model.name: model.min_side for model in model_catalog.MODELS}


def resolve(name: str) -> Builder:
    """A registered builder, or a user's ``package.module:function``."""
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" not in name:
        raise UserError(f"unknown model {name!r}{suggest(name, REGISTRY)}; registered models "
                        f"are {', '.join(REGISTRY)}, or give your own as package.module:function")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, ValueError, TypeError) as e:  # missing, empty or relative name
        raise UserError(f"cannot import {module_name!r} for model {name!r} ({e}): is it on "
                        f"PYTHONPATH on every host?") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UserError(f"{module_name} has no function {attr!r} for model {name!r}")

    def build_user_model(input_shape: tuple[int, ...], num_classes: int,
                         cfg: ModelConfig) -> tf.keras.Model:
        return fn(input_shape, num_classes)
    return build_user_model


def build(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> tf.keras.Model:
    """The model ``cfg`` names (registered or a user's), built for ``input_shape`` and
    ``num_classes``; UserError unless it is a tf.keras.Model with [batch, num_classes] outputs.
    Its BatchNormalization layers are synchronized over ranks with ``cfg.sync_batch_norm``,
    or else compute with the fused kernel (``fused_norm``) unless ``cfg.fused_batch_norm`` is
    off."""
    builder = resolve(cfg.name)
    if MIN_SIDE.get(cfg.name):   # a registered model's input, as its row says
        _need_image(tuple(input_shape), cfg.name, MIN_SIDE[cfg.name])
    try:
        model = builder(tuple(input_shape), num_classes, cfg)
    except UserError:
        raise
    except (ValueError, TypeError) as e:  # e.g. a Keras application refusing an input shape
        raise UserError(f"model {cfg.name} cannot be built for input shape {input_shape} and "
                        f"{num_classes} classes: {str(e).splitlines()[0]}") from None
    if not isinstance(model, tf.keras.Model):
        raise UserError(f"model {cfg.name} returned {type(model).__name__}, not a "
                        f"tf.keras.Model")
    try:
        out = model.output_shape
    except (AttributeError, ValueError, RuntimeError):
        raise UserError(f"model {cfg.name} has no known output shape: build it on "
                        f"tf.keras.Input(input_shape) so that its shapes are defined") from None
    if not (isinstance(out, tuple) and len(out) == 2 and out[-1] == num_classes):
        raise UserError(f"model {cfg.name} outputs shape {out}; it must output "
                        f"[batch, {num_classes}] logits (one per class)")
    if cfg.sync_batch_norm:  # first: the fused kernel takes the plain layer only
        from hvdtrain import distributed as dist  # Horovod's collectives, asked for here only
        dist.synchronize_batch_norm(model)
    if cfg.fused_batch_norm:
        fused_norm.fuse_batch_norm(model)
    return model


# ---------------------------------------------------------------------------------------------
# What every model trains with: the optimizer named by the config, the loss and the metric.

def base_optimizer(optim: OptimConfig, learning_rate: float | Callable | None = None
                   ) -> tf.keras.optimizers.Optimizer:
    """``optim.name`` at ``learning_rate`` (default ``optim.lr``; a Keras schedule works too)."""
    lr = optim.lr if learning_rate is None else learning_rate
    if optim.name == "sgd":
        return tf.keras.optimizers.SGD(learning_rate=lr, momentum=optim.momentum)
    return tf.keras.optimizers.Adam(learning_rate=lr)


def compile_classifier(model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer) -> None:
    """Cross-entropy on the logits the models output, and accuracy. Without XLA: Horovod's
    all-reduce in the train step has no XLA lowering (Keras 3 would turn XLA on by itself
    on a GPU)."""
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                  jit_compile=False)
