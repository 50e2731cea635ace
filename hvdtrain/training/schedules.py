"""Learning-rate rules for N ranks: pure functions, testable without TensorFlow or MPI."""
from __future__ import annotations

import math


def scaled_lr(base_lr: float, world_size: int, rule: str) -> float:
    """The lr for N ranks: linear (Goyal et al., 2017), sqrt (Krizhevsky, 2014) or unchanged.

    With N ranks the global batch is N times larger, so each step can take a larger step.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    factor = {"linear": float(world_size), "sqrt": math.sqrt(world_size), "none": 1.0}
    if rule not in factor:
        raise ValueError(f"unknown lr scaling rule {rule!r}")
    return base_lr * factor[rule]


def scaling_in_force(rule: str, reduce_op: str) -> str:
    """The lr scaling rule that applies: ``auto`` is linear for the average, and none for
    Adasum, which already adds the ranks' gradients where they point apart (Horovod's Adasum
    guide and its examples keep one worker's lr on CPU); any other rule is kept as asked."""
    if rule != "auto":
        return rule
    return "none" if reduce_op == "adasum" else "linear"


def lr_at_step(step: int, *, base_lr: float, peak_lr: float, warmup_steps: int,
               total_steps: int, decay: str = "constant") -> float:
    """The lr for a global step: a linear ramp from base_lr to peak_lr over warmup_steps, then
    peak_lr (constant) or a cosine from peak_lr down to 0 at total_steps.

    The ramp starts at the one-rank lr, so the first steps of a large-batch run are as safe as a
    one-rank run's; ramping per step rather than per epoch avoids jumps.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr + (peak_lr - base_lr) * step / warmup_steps
    if decay == "constant":
        return peak_lr
    if decay == "cosine":
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return 0.5 * peak_lr * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown decay {decay!r}")


def lr_is_final(step: int, *, warmup_steps: int, decay: str) -> bool:
    """Whether ``lr_at_step`` gives the same lr at ``step`` and at every step after it: past
    warmup with a constant decay."""
    return decay == "constant" and step >= warmup_steps
