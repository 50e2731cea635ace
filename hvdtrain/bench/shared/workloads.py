"""The models the benchmarks train: an hvdtrain preset each, with its per-rank batch and input."""
from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.errors import UserError


@dataclass(frozen=True)
class Workload:
    """One model to scale: an hvdtrain preset with its per-rank batch and input."""
    name: str
    preset: str
    batch_size: int
    image_shape: tuple[int, ...]
    num_classes: int = 10


WORKLOADS = {
    # Compute-bound on a CPU core: the benchmark model of Horovod's synthetic benchmark, at a
    # CPU-sized 64x64 input (about 1 s per step of 16 on one core here).
    "mobilenetv2": Workload("mobilenetv2", "synthetic-mobilenetv2", 16, (64, 64, 3)),
    # CIFAR-sized ResNet: fewer parameters to reduce, more compute per parameter.
    "resnet_small": Workload("resnet_small", "synthetic-resnet", 32, (32, 32, 3)),
    # Tiny and communication-bound: the worst case for scaling; seconds per run (--quick).
    "mlp": Workload("mlp", "synthetic-mlp", 32, (8, 8, 1)),
}
DEFAULT_MODELS, QUICK_MODELS = "mobilenetv2,resnet_small", "mlp"
# The plain fit row's model as Keras builds it: Keras 3's own BatchNormalization ops.
PLAIN_KERAS = ("model.fused_batch_norm=false",)


def model_names(text: str | None, quick: bool) -> list[str]:
    """The WORKLOADS named by the comma list ``text`` (None: the default for ``quick``);
    UserError on a name that is not one."""
    names = (text or (QUICK_MODELS if quick else DEFAULT_MODELS)).split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise UserError(f"unknown benchmark model {unknown[0]!r}; choose from "
                        f"{', '.join(WORKLOADS)}")
    return names
