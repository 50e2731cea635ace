"""Reading a Horovod timeline (shared/timeline.py: bench phases' and bench cluster's): a step's
phases, fused gradients once."""
from __future__ import annotations

import json

import pytest

from hvdtrain_bench.shared import jobs, timeline


def timeline_of(steps: list[list[tuple[str, float, float]]], tensors: int) -> str:
    """A Horovod timeline as its coordinator writes it (the array left open): per step, the
    phases (name, begin, end) every one of ``tensors`` gradients goes through, fused."""
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"g{pid}"}}
              for pid in range(tensors)]
    for phases_of_step in steps:
        for pid in range(tensors):
            for name, begin, end in phases_of_step:
                events.append({"ph": "B", "name": name, "ts": begin, "pid": pid})
                events.append({"ph": "E", "ts": end, "pid": pid})
    return "[\n" + ",\n".join(json.dumps(e) for e in events) + ","


def test_the_phases_of_a_step_count_fused_gradients_once():
    # 4 steps 100 us apart; in each, both gradients wait 5 us, then one fused all-reduce of
    # 20 us: 4 in, 10 of MPI, 3 out. A metric all-reduced once (pid 9) is not a gradient.
    steps = [[("NEGOTIATE_ALLREDUCE", t, t + 5), ("ALLREDUCE", t + 5, t + 25),
              ("MEMCPY_IN_FUSION_BUFFER", t + 5, t + 9), ("MPI_ALLREDUCE", t + 9, t + 19),
              ("MEMCPY_OUT_FUSION_BUFFER", t + 19, t + 22)] for t in (0, 100, 200, 300)]
    text = timeline_of(steps, tensors=2)
    text += json.dumps({"ph": "B", "name": "ALLREDUCE", "ts": 50, "pid": 9}) + ","
    text += json.dumps({"ph": "E", "ts": 90, "pid": 9}) + ","
    found = timeline.step_phases(timeline.tensor_phases(timeline.read_timeline(text)), skip=1)
    assert found["gradients"] == 2 and found["steps"] == 3
    assert found["step_ms"] == pytest.approx(0.1)
    assert found["phases_ms"] == pytest.approx({
        "NEGOTIATE_ALLREDUCE": 0.005, "ALLREDUCE": 0.02, "MEMCPY_IN_FUSION_BUFFER": 0.004,
        "MPI_ALLREDUCE": 0.01, "MEMCPY_OUT_FUSION_BUFFER": 0.003})
    # Control: the phase times summed over the gradients count the fused all-reduce twice.
    assert timeline.covered([(5, 25), (5, 25)]) == 20 != (25 - 5) * 2
    assert timeline.covered([(0, 10), (5, 15), (20, 30)]) == 25   # overlapping, then apart
    # Gradients all-reduced one by one, overlapping (Horovod's own optimizer): the phase
    # covers their union, not their sum.
    apart = [{"ph": p, "name": "ALLREDUCE", "ts": t + shift + (20 if p == "E" else 0),
              "pid": pid} for t in (0, 100, 200, 300) for pid, shift in ((0, 0), (1, 10))
             for p in ("B", "E")]
    found = timeline.step_phases(timeline.tensor_phases(apart), skip=0)
    assert found["phases_ms"]["ALLREDUCE"] == pytest.approx(0.03)
    # Too few steps past the warmup to time: said so, not a median of nothing.
    with pytest.raises(jobs.BenchError, match="too few"):
        timeline.step_phases(timeline.tensor_phases(timeline.read_timeline(text)), skip=2)
