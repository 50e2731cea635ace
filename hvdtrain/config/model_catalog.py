"""The models hvdtrain ships (``model.name``), one row each: the one list of them.

``hvdtrain/models/registry.py`` builds each with its function of the row's name; the config's
help, the tests' cases, the benchmarks' workloads and the README's list (a test holds the last
two) take the names from here. Pure, no TensorFlow: the config names them without loading it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """A registered model and the input it takes: any shape (``min_side`` 0), or images of
    shape height,width,channels with both sides at least ``min_side`` (``registry.build``
    refuses others with a UserError before it calls the builder)."""
    name: str
    min_side: int = 0


# In the order the help and the errors list them.
MODELS: tuple[Model, ...] = (
    Model("mlp"),
    Model("cnn", min_side=8),
    Model("resnet_small", min_side=8),
    Model("embedding"),
    Model("mobilenetv2", min_side=32),   # Keras applications, random weights
    Model("resnet50", min_side=32),
)


def names() -> list[str]:
    """The registered models' names, in the table's order."""
    return [model.name for model in MODELS]
