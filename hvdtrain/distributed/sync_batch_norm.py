"""A built model's ``BatchNormalization`` layers turned into this stack's synchronized layer
(the binding's ``sync_batch_normalization_class``: hvdtrain's own on Keras 3, Horovod's on Keras 2),
in place, for any binding."""
from __future__ import annotations

import tensorflow as tf

from hvdtrain.distributed import binding


def synchronize_batch_norm(model: tf.keras.Model) -> int:
    """Every ``BatchNormalization`` layer of ``model`` (nested ones included) computes its
    training moments over all ranks from now on, as this stack's synchronized layer; returns
    how many. Its variables, config and weights stay as they are. Call it once the model is
    built, before the first training step."""
    layer_class = binding.active().sync_batch_normalization_class()
    count = 0
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, tf.keras.layers.BatchNormalization) and not isinstance(
                layer, layer_class):
            # The instance's class swapped: the layer keeps its variables (a copy built from
            # its config would need the model rebuilt around it). Its fused call, if any
            # (fused_norm, Keras 2's own), would never reach the synchronized moments.
            vars(layer).pop("call", None)
            if getattr(layer, "fused", None):
                object.__setattr__(layer, "fused", False)
            object.__setattr__(layer, "__class__", layer_class)
            count += 1
    return count
