"""bench input's pairing of each model's step with the pipelines of its input."""
from __future__ import annotations

import pytest

from hvdtrain.bench import input as input_bench

def test_input_rows_pair_each_model_with_the_sources_of_its_input():
    raw = {"steps": [{"model": "mlp", "preset": "digits-mlp", "shape": [8, 8, 1],
                      "batch_size": 32, "rates": [100.0, 110.0, 90.0]}],
           "pipelines": [{"source": "npz", "shape": [8, 8, 1], "batch_size": 32,
                          "rates": [250.0, 150.0]},
                         {"source": "images", "shape": [8, 8, 1], "batch_size": 32,
                          "rates": [150.0]},
                         {"source": "npz", "shape": [32, 32, 3], "batch_size": 64,
                          "rates": [1.0]}]}   # another model's input: not paired with mlp
    rows = {r["source"]: r for r in input_bench.compare(raw)}
    assert set(rows) == {"npz", "images"}
    assert rows["npz"]["ratio"] == pytest.approx(2.0) and rows["npz"]["meets_goal"]
    assert rows["images"]["ratio"] == pytest.approx(1.5) and not rows["images"]["meets_goal"]
