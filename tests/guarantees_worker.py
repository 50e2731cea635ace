"""Launched by tests/guarantees_table.py (``make guarantees``, tests/multirank/test_guarantees.py):
a matrix of Keras usage patterns, each a small case written as a user's own script would be,
through the library path (``from hvdtrain import distributed as dist``: ``dist.init()``,
``dist.distributed_optimizer``, ``dist.fit_callbacks()``, ``model.fit`` or an own
``train_step``), all in ONE job of 2 ranks.

For each case every rank records, in ``OUT/rankR.json`` (written after every case, so a hang
loses nothing before it): how the case ended (``done``, ``refused`` with the one line of
hvdtrain's UserError, ``not offered``, ``error`` with the exception's type and first line,
``hang`` when Horovod's stall check shut the job's collectives down); the largest difference
between its final weights (BatchNormalization's moving statistics included) and rank 0's,
gathered over the ranks; and, where the case's contract is "as 1 rank at twice the batch", the
largest difference to a reference this rank trains itself with a PLAIN optimizer (no hvdtrain)
on the global batches (batch k of rank 0 followed by batch k of rank 1) from rank 0's initial
weights. Rank 0 prints ``case NAME start`` before each case: a hang shows which case it is.

The cases are in the case modules imported below, each registering its own into CASES
(tests/guarantees_registry.py) as it is imported, so the order of the imports is the order the
cases run in: the ones that may hang, or shut Horovod down, come last; a case that hangs ends the
job, and tests/guarantees_table.py starts another for the cases after it. What the cases share
is in tests/guarantees_patterns.py. Importing this module loads no TensorFlow: the table reads
``CASES`` (names, titles, contracts, notes) from it, every case module imported.
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

# The case modules, in the order their cases run (each appends its cases to CASES).
import guarantees_models  # noqa: F401  (the control, models, fit's and the optimizer's options)
import guarantees_options  # noqa: F401  (reduction, precision, a start on rank 0 only)
import guarantees_one_rank  # noqa: F401  (divergence the consistency check stops)
import guarantees_data  # noqa: F401  (unequal batches, shuffles, saving on every rank)
import horovod_api_cases  # noqa: F401  (Horovod's API: docs/horovod-api.md)
import horovod_api_calls  # noqa: F401  (Horovod's collectives, elastic state, refusals)
import guarantees_apart  # noqa: F401  (ranks apart within an epoch; may hang: last)
from guarantees_patterns import first_line, largest
from guarantees_registry import CASES, STALL_ABORT_S, STALL_WARNING_S, Case, Context, NotOffered
from hvdtrain.launch import rank_process  # TensorFlow loads in main(), through rank_process


# ---------------------------------------------------------------------------------------------
# Running the cases

def run_case(entry: Case, ctx: Context) -> dict:
    """One case on this rank: how it ended, and the comparisons."""
    tf, dist = ctx.tf, ctx.dist
    from hvdtrain.errors import UserError
    tf.keras.backend.clear_session()          # Keras' layer numbering starts again
    started = time.monotonic()
    status, message, result = "done", "", None
    try:
        result = entry.run(ctx)
    except UserError as e:
        status, message = "refused", str(e)
    except NotOffered as e:
        status, message = "not offered", str(e)
    except Exception as e:  # noqa: BLE001  the table records what any case raised
        status = "hang" if dist.lost_a_rank(e) else "error"
        message = first_line(e)
        if status == "error":
            traceback.print_exc()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    record: dict[str, Any] = {"status": status, "message": message,
                              "seconds": round(time.monotonic() - started, 2)}
    if status == "hang":
        return record
    try:
        # Every rank's state: the comparison, and a barrier that shows a rank stuck in the case.
        everyone = dist.allgather_object(result.state if result else None)
    except Exception as e:  # noqa: BLE001
        if not dist.lost_a_rank(e):
            raise
        record.update(status="hang", message=f"{message} (then: {first_line(e)})".strip())
        return record
    if result is not None:
        record["across"] = (largest(result.state, everyone[0])
                            if all(s is not None for s in everyone) else None)
        record["largest_weight"] = max(float(np.max(np.abs(w))) for w in result.state)
        if result.reference is not None:
            record["to_2b"] = largest(result.state, result.reference)
            record["reference_scale"] = max(float(np.max(np.abs(w))) for w in result.reference)
        record["checks"] = result.checks
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cases", default="", help="comma-separated names (default: all)")
    args = parser.parse_args()
    rank_process.load_tensorflow()
    import tensorflow as tf
    from hvdtrain import distributed as dist
    world = dist.init(device="cpu", stall_warning_s=STALL_WARNING_S, stall_abort_s=STALL_ABORT_S)
    ctx = Context(tf, dist, world.rank, world.size, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = args.cases.split(",") if args.cases else [c.name for c in CASES]
    by_name = {c.name: c for c in CASES}
    report = {"stack": world.stack, "size": world.size, "cases": {}}
    path = args.out / f"rank{world.rank}.json"
    for name in chosen:
        if world.is_chief:
            print(f"case {name} start", flush=True)
        record = run_case(by_name[name], ctx)
        report["cases"][name] = record
        path.write_text(json.dumps(report, indent=1))
        if record["status"] == "hang":   # Horovod is shut down: the next job goes on
            break


if __name__ == "__main__":
    main()
    rank_process.end_rank()
