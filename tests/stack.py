"""The one way the tests and their workers ask which stack they run on: whether the installed
Keras is 3 (the default stack) or 2, read from its metadata (no TensorFlow import). What applies
to one stack alone is marked ``keras3_only`` (conftest.py deselects it on the other)."""
from __future__ import annotations

import functools
import importlib.metadata


@functools.cache
def keras3() -> bool:
    return importlib.metadata.version("keras").startswith("3.")
