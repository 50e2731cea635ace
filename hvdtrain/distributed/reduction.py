"""How gradients are combined across ranks, from the config: shared by every Keras binding."""
from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd

from hvdtrain.config import HorovodConfig


def compression(options: HorovodConfig) -> Any:
    # Horovod: fp16 casts float32 gradients to float16 for the wire and back after it.
    return hvd.Compression.fp16 if options.compression == "fp16" else hvd.Compression.none


def reduce_op(options: HorovodConfig) -> Any:
    # Horovod: Adasum combines gradients by their directions instead of averaging them.
    return hvd.Adasum if options.op == "adasum" else hvd.Average
