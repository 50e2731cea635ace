"""A check of one reason the cost model could miss larger buckets: each bucket's transfer
starting when backprop has produced its last gradient, one bucket after the other on the link.

Backprop (cost_model.BACKWARD_SHARE of the round's one-host step) runs from the last variable
to the first, and a variable's gradient is taken to be ready once the backward pass has done
the forward FLOPs of that variable's layer and of every layer after it, in proportion. The
buckets are hvdtrain's own (reducer.buckets); a bucket's transfer starts when its last gradient
is ready and the one before has finished. For every run in DIR (summary.read_runs): the
measured step, the cost model's and this pipeline's, and the pipeline's error.

    .venv/bin/python benchmarks/results/network-bucket-size/pipeline_model.py DIR
"""
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))   # the repository's hvdtrain
import keras  # noqa: E402

from hvdtrain.bench.shared.cost_model import BACKWARD_SHARE  # noqa: E402
from hvdtrain.config import MB  # noqa: E402
from hvdtrain.distributed.reducer import buckets  # noqa: E402
from summary import read_runs  # noqa: E402   # this folder's summary.py, beside this script


def variables():
    """MobileNetV2's trainable variables in order: bytes and their layer's forward FLOPs."""
    model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3))
    layer_of = {id(v): layer for layer in model.layers for v in layer.trainable_weights}
    rows = []
    for v in model.trainable_variables:
        out = layer_of[id(v)].output.shape
        elements = math.prod(v.shape)
        if "kernel" in v.path and len(v.shape) >= 2:   # a multiply-add per weight and position
            flops = 2 * elements * math.prod(out[1:-1])
        else:                                          # batch norm, bias: per output element
            flops = 4 * math.prod(out[1:])
        rows.append((4 * elements, flops))
    return rows


def pipelined_step(rows, one_host_step, gbit_per_s, bucket_mb):
    forward = one_host_step * (1 - BACKWARD_SHARE)
    backward = one_host_step * BACKWARD_SHARE
    total = sum(flops for _, flops in rows)
    ready, done = {}, 0
    for position in reversed(range(len(rows))):
        done += rows[position][1]
        ready[position] = forward + backward * done / total
    finish = 0.0
    for bucket in buckets([size for size, _ in rows], math.ceil(bucket_mb * MB)):
        start = max(max(ready[p] for p in bucket), finish)
        finish = start + sum(rows[p][0] for p in bucket) * 8 / (gbit_per_s * 1e9)
    return max(one_host_step, finish)


rows = variables()
print(f"{len(rows)} variables, {sum(s for s, _ in rows)} bytes")
for (bucket_mb, r), got in sorted(read_runs(sys.argv[1]).items()):
    piped = pipelined_step(rows, got["one_host_step"], got["both_ways"], bucket_mb)
    print(f"mb{bucket_mb}-round{r}: measured {got['measured_step']:.2f} s, cost model "
          f"{got['predicted_step']:.2f} ({got['error']:+.1%}), "
          f"pipelined {piped:.2f} ({piped / got['measured_step'] - 1:+.1%})")
