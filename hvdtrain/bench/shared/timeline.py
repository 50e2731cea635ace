"""What a Horovod timeline holds (pure): its events, each tensor's phases, and the gradients'
phases per step (bench phases, and bench cluster's all-reduce breakdown).

Horovod's coordinator (rank 0) records each tensor's phases: the negotiation (from the first
rank's request until every rank has asked: the wait for the slower rank), then the all-reduce
itself, which on a CPU copies the tensors into the fusion buffer, runs ``MPI_Allreduce`` (or
Gloo's) on it, and copies them out. Every gradient is reduced once a step, so the k-th
occurrence of each gradient's phases belongs to step k; a phase's time in a step is the wall
time the union of its intervals over the gradients covers (fused tensors share one interval,
so they count once). The step is the time between the all-reduce's starts of successive steps.

How much of the all-reduce overlaps backprop: no rank has finished backprop before the last
gradient of the step is asked for (each asks for it when its backward pass has produced it), so
the all-reduce time before that request (the latest negotiation start of the step) ran while
backprop still ran on every rank. One all-reduce after backprop (one bucket) has none.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

from hvdtrain.bench.shared import jobs

# Horovod's phase names for an all-reduce on a CPU, in the order a step goes through them.
PHASES = {"NEGOTIATE_ALLREDUCE": "negotiation (wait for the slower rank)",
          "MEMCPY_IN_FUSION_BUFFER": "copy into the fusion buffer",
          "MPI_ALLREDUCE": "MPI_Allreduce", "GLOO_ALLREDUCE": "Gloo all-reduce",
          "MEMCPY_OUT_FUSION_BUFFER": "copy out of the fusion buffer",
          "ALLREDUCE": "all-reduce (copies, collective and the rest)"}
Interval = tuple[float, float]
# How the reducer's check of missing gradients ends its all-reduce's name (reducer.PLACES).
PLACES = "_places"
# Bytes per element of the dtypes Horovod names where a tensor's all-reduce ends.
DTYPE_BYTES = {"uint8": 1, "int8": 1, "bool": 1, "uint16": 2, "int16": 2, "float16": 2,
               "bfloat16": 2, "int32": 4, "float32": 4, "int64": 8, "float64": 8}


# ---------------------------------------------------------------------------------------------
# What a timeline holds

def read_timeline(text: str) -> list[dict[str, Any]]:
    """A Horovod timeline's events; Horovod leaves the JSON array open while it runs."""
    body = text.rstrip().rstrip(",")
    return json.loads(body if body.endswith("]") else body + "]")


def tensor_names(events: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """Per tensor (a timeline 'process'), its name: Horovod's "process_name" metadata event."""
    return {e["pid"]: e["args"]["name"] for e in events
            if e.get("name") == "process_name" and "name" in e.get("args", {})}


def tensor_phases(events: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, list[Interval]]]:
    """Per tensor (a timeline 'process'), per phase name, its intervals in microseconds, in
    order; a phase is a B event and the E event that closes it. Not the reducer's check of
    which gradients each rank misses, all-reduced once a step like a gradient (PLACES)."""
    checks = {pid for pid, name in tensor_names(events).items() if name.endswith(PLACES)}
    open_phases: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    phases: dict[int, dict[str, list[Interval]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e.get("pid") in checks:
            continue
        if e.get("ph") == "B":
            open_phases[e["pid"]].append(e)
        elif e.get("ph") == "E" and open_phases[e["pid"]]:
            begin = open_phases[e["pid"]].pop()
            phases[e["pid"]][begin["name"]].append((float(begin["ts"]), float(e["ts"])))
    return phases


def tensor_bytes(events: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Per tensor, its size in bytes: Horovod writes the reduced tensor's dtype and shape
    (``"[2257984]"``) on the event that ends its all-reduce."""
    sizes = {}
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "E" and "shape" in args:
            if args.get("dtype") not in DTYPE_BYTES:
                raise jobs.BenchError(f"a timeline tensor of dtype {args.get('dtype')!r}: "
                                      f"its size is not known")
            dims = [int(d) for d in args["shape"].strip("[]").split(",") if d.strip()]
            sizes[e["pid"]] = math.prod(dims) * DTYPE_BYTES[args["dtype"]]
    return sizes


def covered(intervals: Iterable[Interval]) -> float:
    """The length of the union of ``intervals``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def clipped(intervals: Iterable[Interval], end: float) -> list[Interval]:
    """The parts of ``intervals`` before ``end``."""
    return [(a, min(b, end)) for a, b in intervals if a < end]


def overlap_share(allreduces: list[Interval], requests: list[float]) -> float:
    """The share of the wall time ``allreduces`` cover that lies before the last of
    ``requests`` (the negotiation starts: when the last gradient was first asked for)."""
    total = covered(allreduces)
    return covered(clipped(allreduces, max(requests))) / total if total else 0.0


def step_phases(phases: Mapping[int, Mapping[str, list[Interval]]], skip: int,
                sizes: Mapping[int, int] | None = None) -> dict[str, Any]:
    """The gradients' phases per step, in milliseconds, and the share of the all-reduce that
    ran during backprop (``overlap_share``; where the timeline has the negotiations): medians
    over the steps after the first ``skip``; with ``sizes`` (tensor_bytes), the bytes the
    gradients hold. The gradients are the tensors all-reduced the most times, once a step
    each."""
    counts = {pid: len(p.get("ALLREDUCE", [])) for pid, p in phases.items()}
    steps = max(counts.values(), default=0)
    gradients = [pid for pid, n in counts.items() if n == steps]
    if steps - skip < 3:
        raise jobs.BenchError(f"the timeline holds {steps} all-reduces of the "
                                f"gradients, {skip} of them warmup: too few to time")
    per_phase: dict[str, list[float]] = {}
    for name in PHASES:
        if all(len(phases[pid].get(name, [])) == steps for pid in gradients):
            per_phase[name] = [covered(phases[pid][name][k] for pid in gradients) / 1e3
                               for k in range(skip, steps)]
    starts = [min(phases[pid]["ALLREDUCE"][k][0] for pid in gradients)
              for k in range(skip, steps)]
    found = {"gradients": len(gradients), "steps": steps - skip,
             "step_ms": statistics.median(b - a for a, b in zip(starts, starts[1:])) / 1e3,
             "phases_ms": {name: statistics.median(v) for name, v in per_phase.items()}}
    if sizes is not None and all(pid in sizes for pid in gradients):
        found["gradient_bytes"] = sum(sizes[pid] for pid in gradients)
    if "NEGOTIATE_ALLREDUCE" in per_phase:
        found["during_backprop"] = statistics.median(
            overlap_share([phases[pid]["ALLREDUCE"][k] for pid in gradients],
                          [phases[pid]["NEGOTIATE_ALLREDUCE"][k][0] for pid in gradients])
            for k in range(skip, steps))
    return found
