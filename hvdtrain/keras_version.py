"""Which Keras this process runs: the one place hvdtrain asks. The binding
(``distributed/binding.py``) picks its module by it, ``models/fused_norm.py`` whether Keras
needs its fused kernel; it lies below both, without Horovod, so that building a model does not
load Horovod."""
from __future__ import annotations

import importlib.metadata

import tensorflow as tf


def keras_version() -> str:
    """The installed Keras's version, e.g. "3.15.1" or "2.15.0"."""
    # Keras 3's tf.keras has __version__; Keras 2's (TensorFlow 2.15) does not, but its package
    # metadata says which.
    return getattr(tf.keras, "__version__", None) or importlib.metadata.version("keras")


def keras_major() -> int:
    """The installed Keras's major version: 2 or 3 on a supported stack."""
    return int(keras_version().split(".")[0])
