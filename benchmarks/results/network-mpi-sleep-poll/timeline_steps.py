"""Rank 0's Horovod timeline of bench network's gradients (2 MB buckets, or all of them at
once): for the last 3 whole steps, when each all-reduce of them ran, in seconds from the
step's first (buckets fused into one all-reduce together), how long it took, and the step
(to the next step's first).

    .venv/bin/python timeline_steps.py TIMELINE.json[.gz] ...   (hvdtrain importable)
"""
from __future__ import annotations

import gzip
import sys

from hvdtrain.bench.shared.timeline import read_timeline, tensor_names, tensor_phases

GAP_S = 0.15     # the link idle this long between two all-reduces: the next step has begun
FUSED_S = 0.002  # all-reduces ending this close together were one fused all-reduce


def spans(path: str) -> list[tuple[float, float, str]]:
    """(start s, end s, bucket) of every MPI or Gloo all-reduce of hvdtrain's gradients."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as file:
        events = read_timeline(file.read())
    names = tensor_names(events)
    out = []
    for pid, phases in tensor_phases(events).items():
        tensor = names.get(pid, "")
        if "hvdtrain_gradients" not in tensor:
            continue
        bucket = tensor.split("gradients")[1].lstrip("_").replace("_1of1", "") or "all"
        for phase in ("MPI_ALLREDUCE", "GLOO_ALLREDUCE"):
            out += [(began / 1e6, ended / 1e6, bucket) for began, ended in phases.get(phase, [])]
    return sorted(out)


def steps(path: str) -> list[list[tuple[float, float, str]]]:
    """The all-reduces (start, end, buckets joined by +) of each step, in order."""
    fused: list[tuple[float, float, list[str]]] = []
    for began, ended, bucket in spans(path):
        if fused and abs(ended - fused[-1][1]) < FUSED_S:
            fused[-1][2].append(bucket)
        else:
            fused.append((began, ended, [bucket]))
    out: list[list[tuple[float, float, str]]] = [[]]
    for began, ended, buckets in fused:
        if out[-1] and began - out[-1][-1][1] > GAP_S:
            out.append([])
        out[-1].append((began, ended, "+".join(sorted(buckets))))
    return out


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(path)
        found = steps(path)
        for step, following in list(zip(found, found[1:]))[-3:]:
            t0 = step[0][0]
            cells = [f"{b} {a - t0:.2f} to {e - t0:.2f} s ({e - a:.2f})" for a, e, b in step]
            print(f"  step {following[0][0] - t0:.2f} s: " + "; ".join(cells))
