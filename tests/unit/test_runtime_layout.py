"""The runtime package's layers as docs/layout.md draws them, read from the sources' imports
(every one, inside functions too): no import circle, and no module imports a package of a
higher layer (distributed/ never imports training/, say)."""
from __future__ import annotations

import pytest

from helpers import ROOT
from test_bench_layout import circle, graph

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

# Bottom to top: a module may import its own layer and those below it.
LAYERS = [
    ["hvdtrain", "hvdtrain.errors", "hvdtrain.files", "hvdtrain.progress",
     "hvdtrain.keras_version",    # the one place that asks Keras's version
     "hvdtrain.version"],         # hvdtrain's version and commit
    ["hvdtrain.config"],
    ["hvdtrain.launch"],        # no Horovod: what a rank sets before hvd.init()
    ["hvdtrain.distributed"],   # the only package that imports Horovod
    ["hvdtrain.data"],
    ["hvdtrain.models"],
    ["hvdtrain.horovod"],       # Horovod's own API for Horovod's scripts: distributed, models
    ["hvdtrain.training"],
    ["hvdtrain.install"],
    ["hvdtrain.testing"],
    ["hvdtrain.commands", "hvdtrain.bench"],   # `hvdtrain bench` and the benchmarks
    ["hvdtrain.cli", "hvdtrain.listeners"],   # the entry points
]


def layer(module: str) -> int:
    """The layer of ``module``: that of the longest entry of LAYERS it is or lies under."""
    found = [(len(name), i) for i, names in enumerate(LAYERS) for name in names
             if module == name or module.startswith(f"{name}.")]
    return max(found)[1]


def arrows_up(edges: dict[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a in sorted(edges) for b in sorted(edges[a]) if layer(b) > layer(a)]


def test_the_runtime_import_graph_has_no_circle_and_no_arrow_up():
    edges = graph(ROOT / "hvdtrain", "hvdtrain")
    assert len(edges) > 60 and circle(edges) == [], circle(edges)
    assert arrows_up(edges) == []
    # Every module has a layer of its own package, not only the root's catch-all.
    assert all(layer(m) > 0 for m in edges if m.count(".") >= 1 and m not in LAYERS[0])


def test_control_an_arrow_up_and_a_circle_are_caught():
    edges = graph(ROOT / "hvdtrain", "hvdtrain")
    # distributed importing training (as the broadcast once imported the trainer's watchdog)
    edges["hvdtrain.distributed.broadcast"].add("hvdtrain.training.callbacks")
    assert arrows_up(edges) == ["hvdtrain.distributed.broadcast -> hvdtrain.training.callbacks"]
    # the seam and batch_norm importing each other (as they did, inside a function)
    edges["hvdtrain.distributed.batch_norm"].add("hvdtrain.distributed.binding")
    assert circle(edges) == ["hvdtrain.distributed.batch_norm", "hvdtrain.distributed.binding",
                             "hvdtrain.distributed.batch_norm"]
