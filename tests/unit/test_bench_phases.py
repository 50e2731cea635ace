"""Reading a Horovod timeline (shared/timeline.py: bench phases' and bench cluster's): a step's
phases, fused gradients once."""
from __future__ import annotations

import argparse
import json

import pytest

from hvdtrain.errors import UserError
from hvdtrain.bench.shared import jobs, timeline


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
    found = found_fused = timeline.step_phases(
        timeline.tensor_phases(timeline.read_timeline(text)), skip=1)
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
    # One fused all-reduce after backprop overlaps none of it.
    assert found_fused["during_backprop"] == 0.0
    # Too few steps past the warmup to time: said so, not a median of nothing.
    with pytest.raises(jobs.BenchError, match="too few"):
        timeline.step_phases(timeline.tensor_phases(timeline.read_timeline(text)), skip=2)


def test_the_share_of_the_all_reduce_during_backprop_is_what_ran_before_the_last_request():
    # Two buckets a step: the last layers' gradient (pid 1) is asked for at t and all-reduced
    # at t+5..t+25; the first layers' one (pid 0), the last backprop produces, is asked for at
    # t+15 and all-reduced at t+30..t+40. 10 of the 30 us of all-reduce ran before t+15.
    def step(t: float) -> list[dict]:
        phases = {1: (("NEGOTIATE_ALLREDUCE", t, t + 5), ("ALLREDUCE", t + 5, t + 25)),
                  0: (("NEGOTIATE_ALLREDUCE", t + 15, t + 30), ("ALLREDUCE", t + 30, t + 40))}
        return [{"ph": p, "name": name, "ts": begin if p == "B" else end, "pid": pid}
                for pid, of_pid in phases.items() for name, begin, end in of_pid
                for p in ("B", "E")]
    events = [e for t in (0, 100, 200, 300) for e in step(t)]
    found = timeline.step_phases(timeline.tensor_phases(events), skip=1)
    assert found["during_backprop"] == pytest.approx(1 / 3)
    # Control: the same all-reduces with both gradients asked for at t (backprop over before
    # either all-reduce began) overlap none of it.
    early = [dict(e, ts=e["ts"] - 15) if e["name"] == "NEGOTIATE_ALLREDUCE" and e["pid"] == 0
             and e["ph"] == "B" else e for e in events]
    assert timeline.step_phases(timeline.tensor_phases(early), skip=1)["during_backprop"] == 0.0


def test_bench_phases_reports_the_bucketed_step_against_the_one_bucket_step_of_its_round():
    from hvdtrain.bench import phases

    def job(step_ms: float, during: float) -> dict:
        return {"stack": "s", "step_ms": step_ms, "gradients": 3, "during_backprop": during,
                "phases_ms": {"ALLREDUCE": step_ms / 10}}
    bucketed = phases.bucket_variant(2)
    rounds = [{"this": job(100, 0.0), bucketed: job(b, 0.4)} for b in (98, 99, 101)]
    summary = phases.summarize_model("m", rounds, [0.1] * 3)
    ratio = summary["overlap"][bucketed]["step_vs_this"]
    assert ratio["per_round"] == pytest.approx([0.98, 0.99, 1.01])
    assert summary["overlap"][bucketed]["during_backprop"]["median"] == pytest.approx(0.4)
    # Control: the one-bucket run against itself is 1 in every round, and overlaps nothing.
    assert summary["overlap"]["this"]["step_vs_this"]["per_round"] == [1.0] * 3
    assert summary["overlap"]["this"]["during_backprop"]["median"] == 0.0
    text = phases.markdown({"ranks": 2, "plan": {"rounds": 3}, "results": [summary],
                            "stacks": {"this": "a", bucketed: "a"},
                            "machine": {"cpu": "c", "cores": 2, "os": "o", "python": "3",
                                        "date_utc": "d"}})
    assert "| m | this, 2 MB buckets | 40.0% (spread 0.0%) | 0.9900 (spread 3.0%) |" in text


def test_the_gradients_bytes_are_read_from_where_horovod_ends_each_all_reduce():
    # Horovod writes the reduced tensor's dtype and shape on the event that ends its
    # all-reduce: two gradients (3 x 4 float32, 10 float16) and a metric (pid 9, once).
    steps = [[("ALLREDUCE", t, t + 20)] for t in (0, 100, 200, 300)]
    events = timeline.read_timeline(timeline_of(steps, tensors=2))
    shapes = {0: ("float32", "[3, 4]"), 1: ("float16", "[10]"), 9: ("float64", "[]")}
    events += [{"ph": "B", "name": "ALLREDUCE", "ts": 50, "pid": 9},
               {"ph": "E", "ts": 90, "pid": 9}]
    events += [{"ph": "E", "ts": 0, "pid": pid, "args": {"dtype": dtype, "shape": shape}}
               for pid, (dtype, shape) in shapes.items()]
    sizes = timeline.tensor_bytes(events)
    assert sizes == {0: 48, 1: 20, 9: 8}
    found = timeline.step_phases(timeline.tensor_phases(events), skip=1, sizes=sizes)
    assert found["gradient_bytes"] == 68          # the metric's 8 bytes are not a gradient's
    # Control: without the sizes (or with a gradient's missing) no bytes are claimed.
    assert "gradient_bytes" not in timeline.step_phases(timeline.tensor_phases(events), skip=1)
    del sizes[1]
    assert "gradient_bytes" not in timeline.step_phases(timeline.tensor_phases(events), skip=1,
                                                        sizes=sizes)
    with pytest.raises(jobs.BenchError, match="'complex64'"):
        timeline.tensor_bytes([{"ph": "E", "pid": 0, "args": {"dtype": "complex64",
                                                              "shape": "[2]"}}])


def test_bench_phases_holds_each_all_reduce_after_backprop_against_raw_mpi_of_its_bytes():
    from hvdtrain.bench import phases

    def job(allreduce_ms: float, during: float = 0.0, nbytes: int = 1_000_000,
            raw_ms: float | None = None) -> dict:
        found = {"stack": "s", "step_ms": 100.0, "gradients": 1, "during_backprop": during,
                 "gradient_bytes": nbytes,
                 "phases_ms": {"MPI_ALLREDUCE": allreduce_ms - 0.2, "ALLREDUCE": allreduce_ms}}
        return found if raw_ms is None else {**found, "raw_mpi_ms": raw_ms}
    bucketed = phases.bucket_variant(2)
    # Raw MPI takes 2 ms a round; the flat tensor 2.4, 2.5 and 2.6 (1.2x, 1.25x, 1.3x); the
    # grouped all-reduce, 8 padding bytes fewer, 6 ms; buckets run during backprop, and the
    # other stack reduced other bytes: neither is held against raw MPI.
    rounds = [{"this": job(a, raw_ms=2.0), phases.GROUPED: job(6.0, nbytes=999_992),
               bucketed: job(3.0, during=0.3), "other": job(3.0, nbytes=2_000_000)}
              for a in (2.4, 2.5, 2.6)]
    summary = phases.summarize_model("m", rounds, [0.1] * 3)
    against = summary["of_raw_mpi"]
    assert set(against) == {"this", phases.GROUPED}
    assert against["this"]["ALLREDUCE"]["per_round"] == pytest.approx([1.2, 1.25, 1.3])
    assert against["this"]["MPI_ALLREDUCE"]["per_round"] == pytest.approx([1.1, 1.15, 1.2])
    assert against[phases.GROUPED]["ALLREDUCE"]["median"] == pytest.approx(3.0)
    def report(summary: dict) -> str:
        return phases.markdown({"ranks": 2, "plan": {"rounds": 3}, "results": [summary],
                                "stacks": {k: "a" for k in rounds[0]},
                                "machine": {"cpu": "c", "cores": 2, "os": "o", "python": "3",
                                            "date_utc": "d"}})
    text = report(summary)
    assert "| m | this | 1,000,000 | 2.00 | 1.1500 (spread 8.7%) | 1.2500 (spread 8.0%) |" \
        in text
    assert "all-reduce over raw MPI_Allreduce: 1.2500 (spread 8.0%): meets <= 1.3" in text
    # Control: a flat tensor at 2.8 ms (1.4x) misses the target; a round without raw MPI's
    # time (no bytes in its timeline) holds nothing against it, and says nothing.
    slow = phases.summarize_model("m", [{**r, "this": job(2.8, raw_ms=2.0)} for r in rounds],
                                  [0.1] * 3)
    assert "all-reduce over raw MPI_Allreduce: 1.4000 (spread 0.0%): misses <= 1.3" in report(
        slow)
    unmeasured = phases.summarize_model("m", [{**r, "this": job(2.4)} for r in rounds],
                                        [0.1] * 3)
    assert unmeasured["of_raw_mpi"] == {} and "MPI_Allreduce of the same" not in report(
        unmeasured)


def test_bench_phases_runs_this_stack_once_more_with_another_horovod_build(monkeypatch,
                                                                          tmp_path):
    from hvdtrain.bench import phases
    from hvdtrain.bench.shared import host, plots, report

    def job(workload, plan, work_dir, python, settings=(), env=None, raw_mpi=False) -> dict:
        ran.append((settings, env, raw_mpi))
        return {"stack": "s", "step_ms": 100.0, "gradients": 1, "during_backprop": 0.0,
                "phases_ms": {"ALLREDUCE": 3.0}}
    ran: list = []
    monkeypatch.setattr(phases, "measure", job)
    monkeypatch.setattr(host, "machine", lambda python=None: {
        "cpu": "c", "cores": 2, "os": "o", "python": "3", "date_utc": "d"})
    monkeypatch.setattr(report, "write_outputs", lambda *a: None)
    monkeypatch.setattr(plots, "plot_bars", lambda *a, **k: None)
    build = tmp_path / "unpatched"
    result = phases.run(tmp_path, models=["mlp"], rounds=1, quick=True, bucket_mb=0,
                        other_horovod=build)
    # This stack, grouped, and with the other build: only that run's ranks get its folder
    # first on their PYTHONPATH, and only this stack's job times raw MPI_Allreduce after it.
    assert set(result["stacks"]) == {"this", phases.GROUPED, phases.OTHER_HOROVOD}
    assert sorted(ran, key=str) == sorted([((), {}, True),
                                           (("horovod.flatten=false",), {}, False),
                                           ((), {"PYTHONPATH": str(build.resolve())}, False)],
                                          key=str)
    assert result["other_horovod"] == str(build)
    # Control: without it, no such run.
    ran.clear()
    assert phases.OTHER_HOROVOD not in phases.run(tmp_path, models=["mlp"], rounds=1,
                                                  quick=True, bucket_mb=0)["stacks"]
    assert len(ran) == 2


def test_bench_phases_refuses_another_horovod_folder_without_horovod(tmp_path):
    from hvdtrain.bench import phases

    args = argparse.Namespace(other_horovod=tmp_path, bucket_mb=None, quick=True, models=None,
                              rounds=None, venv=None, other_venv=None, out=str(tmp_path))
    with pytest.raises(UserError, match="no horovod package in it"):
        phases.main(args)
