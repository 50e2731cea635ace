"""What each Keras binding runs: one table per binding, each refusal stated once with its reason.

Plain values, no TensorFlow: the config reads the tables when it is built (before any rank
imports TensorFlow), and the seam (``distributed/binding.py``) reads its binding's table for the
refusals of the library calls. Each binding module names its table (``CAPABILITIES``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """One binding's table. A field is None where the binding runs the option, else why not:
    one clause, which each refusal line puts after its own words."""

    keras: str                       # "Keras 2", as the refusal lines name the stack
    adasum_in_fit: str | None        # horovod.op=adasum in dist.distributed_optimizer (fit)
    accumulation_in_fit: str | None  # horovod.backward_passes_per_step > 1 in fit
    join_uneven_in_fit: str | None   # horovod.join_uneven in fit
    bucket_mb: str | None            # horovod.bucket_mb > 0 in the distributed optimizer and tape
    unscale_gradients: str | None    # dist.unscale_gradients


# What both bindings refuse in fit, for the same reason.
_ACCUMULATION = "hvdtrain accumulates gradients in its own loop"
_JOIN = "Keras fit cannot stop one rank early and wait in hvd.join"

# Both bindings' optimizers and tapes reduce through the one reducer (distributed/reducer.py):
# Adasum in fit and buckets run on both.
KERAS2 = Capabilities(
    keras="Keras 2",
    adasum_in_fit=None,
    accumulation_in_fit=_ACCUMULATION,
    join_uneven_in_fit=_JOIN,
    bucket_mb=None,
    unscale_gradients=None,
)

KERAS3 = Capabilities(
    keras="Keras 3",
    adasum_in_fit=None,
    accumulation_in_fit=_ACCUMULATION,
    join_uneven_in_fit=_JOIN,
    bucket_mb=None,
    # Keras 3's LossScaleOptimizer unscales (and checks for inf/NaN) inside apply_gradients:
    # gradients unscaled before would be unscaled twice, and handed back still scaled they
    # would mislead whoever clips or logs them.
    unscale_gradients=("its LossScaleOptimizer unscales inside apply_gradients, so pass it the "
                       "scaled gradients; to clip or log them, divide by optimizer.dynamic_scale "
                       "first"),
)

BINDINGS = (KERAS2, KERAS3)


def refused_by_any(option: str) -> str | None:
    """Why some binding does not run ``option`` (a field of ``Capabilities``), or None when
    every one does. A config means the same on both stacks, so what one refuses in fit the
    config refuses on both, saying which refuses it where they differ."""
    reasons = {table.keras: getattr(table, option) for table in BINDINGS}
    refused = {keras: why for keras, why in reasons.items() if why}
    if not refused:
        return None
    if len(refused) == len(reasons) and len(set(refused.values())) == 1:
        return next(iter(refused.values()))
    said = "; ".join(f"on {keras} {why}" for keras, why in refused.items())
    if len(refused) == len(reasons):
        return said
    return f"{said}, and a config means the same on both stacks"
