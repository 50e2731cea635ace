"""hvdtrain.distributed.batch_norm without a launcher: which variables are normalization
statistics, and ``model.sync_batch_norm`` (every BatchNormalization layer synchronized, none on
the fused kernel, named in the banner). Across ranks: tests/multirank/test_batch_norm.py."""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from hvdtrain import distributed as dist
from hvdtrain.models import registry
from hvdtrain.training import report
from hvdtrain.config import presets
from hvdtrain.config import ModelConfig


def batch_norm_layers(model: tf.keras.Model) -> list:
    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, tf.keras.layers.BatchNormalization)]


def test_the_statistics_are_the_moving_averages_of_every_batch_norm_layer_nested_too():
    model = registry.build(ModelConfig(name="resnet_small", width=8, dropout=0.2), (8, 8, 3), 3)
    nested = tf.keras.Sequential([tf.keras.Input((8, 8, 3)), model])  # the same, one level down
    found = dist.normalization_statistics(nested)
    expected = [v for layer in batch_norm_layers(model)
                for v in (layer.moving_mean, layer.moving_variance)]
    assert len(expected) == 2 * 15
    assert len(found) == len(expected)  # each once (in Keras' walk's order, the same on
    assert {id(v) for v in found} == {id(v) for v in expected}  # every rank)
    # Control: the model's other non-trainable state (Keras 3: the Dropout's integer seed
    # generator state) is left out.
    others = [v for v in nested.non_trainable_weights if all(v is not s for s in found)]
    assert all(not tf.as_dtype(v.dtype).is_floating for v in others)
    mlp = registry.build(ModelConfig(name="mlp"), (8, 8, 1), 3)
    assert dist.normalization_statistics(mlp) == []


def test_model_sync_batch_norm_synchronizes_every_layer_off_the_fused_kernel():
    sync = dist.SyncBatchNormalization
    assert issubclass(sync, tf.keras.layers.BatchNormalization)
    built = registry.build(ModelConfig(name="resnet_small", width=8, sync_batch_norm=True),
                         (8, 8, 3), 3)
    layers = batch_norm_layers(built)
    assert layers and all(type(layer) is sync and "call" not in vars(layer) for layer in layers)
    assert not any(getattr(layer, "fused", False) for layer in layers)  # Keras 2's kernel
    # Control: the default keeps the plain layer (on Keras 3, on the fused kernel).
    plain = batch_norm_layers(registry.build(ModelConfig(name="resnet_small", width=8),
                                           (8, 8, 3), 3))
    assert all(type(layer) is tf.keras.layers.BatchNormalization for layer in plain)


def test_the_banner_names_synchronized_batch_norm():
    config = presets.digits()
    synchronized = dataclasses.replace(
        config, model=dataclasses.replace(config.model, sync_batch_norm=True))
    world = dist.World(0, 2, 0, 2, "mpi", "/CPU:0", 1, 1, "stack")
    lines = [report.banner(cfg, world, data="d", params=1, steps=1, peak_lr=0.1, start_epoch=0,
                           horovod_in_force="", buckets_mb=0, run_dir="r",
                           hvdtrain="0.2.0").splitlines()[2]
             for cfg in (synchronized, config)]
    assert lines == ["  model cnn, 1 parameters, synchronized batch norm",
                     "  model cnn, 1 parameters"]
