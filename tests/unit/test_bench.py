"""The benchmarks: their arithmetic (no MPI), and `hvdtrain bench all --quick` for real, with
its figures checked for sense (not for speed: speed targets are figures in the output)."""
from __future__ import annotations

import json
import statistics
import warnings

import pytest

from helpers import assert_ok, hvdtrain, keras_major, run_job
from hvdtrain.bench import (allreduce, common, ops, peers, phases, project, scaling, stacks,
                            suite, tax, versus_horovod)
from hvdtrain.bench import input as input_bench


def test_total_rate_counts_every_rank_at_the_slowest_ranks_time():
    per_rank = [{"samples": [100, 100], "seconds": [1.0, 2.0]},
                {"samples": [100, 100], "seconds": [2.0, 1.0]}]
    assert scaling.repeat_rates(per_rank) == [100.0, 100.0]  # 200 samples / 2 s, each repeat
    with pytest.raises(ValueError):
        scaling.repeat_rates([{"samples": [1], "seconds": [1.0]},
                              {"samples": [1, 1], "seconds": [1.0, 1.0]}])


def test_total_rate_is_the_sum_of_every_ranks_samples_over_the_slowest_time():
    # Ranks that counted other numbers of samples in other times: 100 in 1 s and 320 in 2 s.
    per_rank = [{"samples": [100], "seconds": [1.0]}, {"samples": [320], "seconds": [2.0]}]
    (total,) = scaling.repeat_rates(per_rank)
    assert total == 210.0                            # (100 + 320) / 2 s
    # Controls: the wrong totals this check tells apart.
    assert total != 2 * 100 / 1.0                    # rank 0's rate times the world size
    assert total != 100 / 1.0 + 320 / 2.0            # the per-rank rates summed
    assert total != (100 + 320) / 1.5                # over the mean time, not the slowest


def test_the_step_breakdown_splits_each_step_at_its_start():
    # Warmup epoch, then two timed epochs of steps 10 s apart; between steps 1 s, then 3 s.
    starts = [[0.0, 5.0], [100.0, 109.0, 119.0], [200.0, 213.0]]
    ends = [[1.0, 6.0], [108.0, 118.0, 128.0], [210.0, 220.0]]
    figures = scaling.step_breakdown(starts, ends, warmup=1)
    assert figures["step_seconds_median"] == pytest.approx(10.0)
    assert figures["between_steps_seconds_median"] == pytest.approx(1.0)   # 1, 1, 3
    # Controls: a step's own time (end - start) and gaps across an epoch's boundary are not it.
    assert figures["step_seconds_median"] != statistics.median([8, 9, 9, 10, 7])
    assert figures["between_steps_seconds_median"] != statistics.median([1, 1, 72, 3])
    with pytest.raises(ValueError):
        scaling.step_breakdown([[0.0]], [[1.0]], warmup=0)


def test_only_the_named_rank_is_slowed():
    assert scaling.slow_rank_delay("1:0.2", 1) == 0.2
    assert scaling.slow_rank_delay("1:0.2", 0) == 0.0 and scaling.slow_rank_delay("", 1) == 0.0


def test_weak_scaling_efficiency_and_synthetic_sizes():
    assert scaling.weak_scaling_efficiency(190.0, 2, 100.0) == pytest.approx(0.95)
    num_samples, eval_fraction = scaling.synthetic_sizes(ranks=2, batch_size=16,
                                                         steps_per_epoch=9)
    train = round(num_samples * (1 - eval_fraction))
    assert train == 2 * 16 * 9 and num_samples - train == 2 * 16


def test_bus_bandwidth_follows_nccl_tests():
    algbw, busbw = allreduce.bandwidths(nbytes=1 << 20, seconds=1e-3, ranks=4)
    assert algbw == pytest.approx((1 << 20) / 1e-3)
    assert busbw == pytest.approx(algbw * 2 * 3 / 4)
    assert allreduce.bandwidths(1000, 1.0, 1)[1] == 0.0   # one rank moves nothing


def test_ring_model():
    assert project.ring_allreduce_seconds(1, 1e6, 1e-5, 1e-9) == 0.0
    assert project.ring_allreduce_seconds(4, 1e6, 1e-5, 1e-9) == pytest.approx(
        6 * 1e-5 + 1.5 * 1e6 * 1e-9)
    efficiencies = [project.efficiency(0.1, n, 4e7, 1e-5, 8 / 25e9) for n in (2, 8, 64, 512)]
    assert all(0 < e <= 1 for e in efficiencies)
    assert efficiencies == sorted(efficiencies, reverse=True)


def test_summaries_and_parsers():
    s = scaling.common.summarize([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert s["spread"] == pytest.approx(1.0)
    assert peers.epoch_rates([1.0, 2.0, 2.5], 100) == [100.0, 200.0]
    assert peers.time_to_accuracy([1.0, 2.0, 3.0], [0.9, 0.96, 0.97]) == 2.0
    assert peers.time_to_accuracy([1.0], [0.5]) is None
    output = "Iter #0: 15.2 img/sec per CPU\nIter #1: 15.8 img/sec per CPU\n"
    assert versus_horovod.horovod_rates(output) == [15.2, 15.8]


def test_input_rows_pair_each_model_with_the_sources_of_its_input():
    raw = {"steps": [{"model": "mlp", "preset": "digits-mlp", "shape": [8, 8, 1],
                      "batch_size": 32, "rates": [100.0, 110.0, 90.0]}],
           "pipelines": [{"source": "npz", "shape": [8, 8, 1], "batch_size": 32,
                          "rates": [250.0, 150.0]},
                         {"source": "images", "shape": [8, 8, 1], "batch_size": 32,
                          "rates": [150.0]},
                         {"source": "npz", "shape": [32, 32, 3], "batch_size": 64,
                          "rates": [1.0]}]}   # another model's input: not paired with mlp
    rows = {r["source"]: r for r in input_bench.compare(raw)}
    assert set(rows) == {"npz", "images"}
    assert rows["npz"]["ratio"] == pytest.approx(2.0) and rows["npz"]["meets_goal"]
    assert rows["images"]["ratio"] == pytest.approx(1.5) and not rows["images"]["meets_goal"]


def test_stack_ratios_are_per_round_medians_and_wide_spreads_are_noise():
    row = lambda rate: {"batch_size_per_rank": 32, "per_rank_samples_per_sec": {"median": rate}}
    assert stacks.step_ms(row(3200.0)) == pytest.approx(10.0)
    assert stacks.allreduce_cost_ms(row(3200.0), row(1600.0)) == pytest.approx(10.0)
    figures = lambda a, b, c: {"samples_per_sec_1": a, "samples_per_sec_2": b,
                               "allreduce_ms_per_step": c,
                               "efficiency_2": scaling.weak_scaling_efficiency(b, 2, a)}
    # Round 2 ran on a slower machine for both stacks: the per-round ratio cancels it.
    rounds = [{"this": figures(100, 190, 2.0), "other": figures(100, 200, 1.0)},
              {"this": figures(50, 95, 4.0), "other": figures(50, 100, 2.0)},
              {"this": figures(99, 188, 2.0), "other": figures(100, 200, 1.0)}]
    r = stacks.ratios(rounds, "this", "other")
    assert r["samples_per_sec_2"]["median"] == pytest.approx(0.95)
    assert not r["samples_per_sec_2"]["noise"]
    assert r["allreduce_ms_per_step"]["median"] == pytest.approx(2.0)
    rounds[1]["this"]["samples_per_sec_1"] = 80  # one round 60% off: flagged, not a result
    assert stacks.ratios(rounds, "this", "other")["samples_per_sec_1"]["noise"]


def test_each_stacks_efficiency_is_a_median_over_rounds_against_the_target():
    efficiency = lambda *per_round: common.ratio_summary(per_round)
    assert stacks.efficiency_cell(efficiency(0.95, 0.96, 0.955), True) == \
        "0.9550 (spread 1.0%): meets >= 0.95"
    # Control: a median just under the target misses, and prints so.
    assert stacks.efficiency_cell(efficiency(0.94, 0.96, 0.9495), True).endswith(
        "misses >= 0.95")
    assert stacks.efficiency_cell(efficiency(0.80, 0.96, 0.90), True).endswith(
        "noise: does not count")
    assert stacks.efficiency_cell(efficiency(1.06, 1.07, 1.06), True).endswith(
        "above 1.05, noise")
    assert stacks.efficiency_cell(efficiency(0.90, 0.91, 0.90), False) == "0.9000 (spread 1.1%)"


def test_the_tax_is_a_per_round_median_and_wide_spreads_are_noise():
    # Round 2 ran on a slower machine for both sides: the per-round ratio cancels it.
    rounds = [{"plain": 100.0, "hvdtrain": 98.0}, {"plain": 50.0, "hvdtrain": 49.0},
              {"plain": 100.0, "hvdtrain": 99.0}]
    ratio = tax.ratio_summary(rounds)
    assert ratio["median"] == pytest.approx(0.98) and not ratio["noise"]
    rounds[1]["hvdtrain"] = 30.0  # one round 40% off: flagged, not a result
    assert tax.ratio_summary(rounds)["noise"]
    assert tax.stack_name("tensorflow 2.15.1, keras 2.15.0, horovod 0.28.1") == "keras2"


def test_an_ops_own_time_leaves_out_the_events_nested_in_it():
    # One thread: the executor's event around a convolution that encloses a relu that encloses
    # a mul, then an add after them; events arrive in any order.
    events = [(12.0, 2.0, "s/add:AddV2"), (2.5, 1.0, "s/mul:Mul#id=7#"),
              (0.0, 15.0, "ExecutorState::Process"), (2.0, 3.0, "s/relu:Relu"),
              (0.0, 10.0, "s/conv:_MklNativeConv2D")]
    own = ops.self_times(events)
    assert own == {"ExecutorState::Process": 3.0, "s/conv:_MklNativeConv2D": 7.0,
                   "s/relu:Relu": 2.0, "s/mul:Mul#id=7#": 1.0, "s/add:AddV2": 2.0}
    assert sum(own.values()) == 15.0   # the thread's busy time, each moment counted once
    # Control: durations summed as they come count the mul three times and the relu twice.
    assert sum(d for _, d, _ in events) == 31.0
    # Per op type, over threads; the runtime's own events are not ops.
    per_type = ops.op_seconds([events, [(1.0, 4.0, "t/conv2:_MklNativeConv2D")]])
    assert per_type == {"_MklNativeConv2D": 11.0, "Relu": 2.0, "Mul": 1.0, "AddV2": 2.0}
    for runtime in ("ExecutorState::Process", "MemoryAllocation",
                    "StatefulPartitionedCall: __inference_train_function_12",
                    "Iterator::Root::Prefetch"):
        assert ops.op_type(runtime) is None, runtime
    grouped = ops.groups(per_type, step_ms=20.0)
    assert grouped == {"profiled step": 20.0, "all ops": 16.0,
                       "oneDNN kernels (_Mkl*)": 11.0, "other ops": 5.0,
                       "beyond the ops (runtime)": 4.0}


def test_the_ops_ratios_are_per_round_and_wide_spreads_are_noise():
    def job(step: float, conv: float, relu: float) -> dict:
        return {"step_ms": step, "profiled_step_ms": step + 1,
                "ops_ms": {"_MklNativeConv2D": conv, "Relu": relu}}
    # Round 2 ran on a slower machine for both stacks: the per-round ratio cancels it.
    rounds = [{"this": job(10, 6, 2), "other": job(10, 5, 2)},
              {"this": job(20, 12, 4), "other": job(20, 10, 4)},
              {"this": job(10, 6, 2), "other": job(10, 5, 2)}]
    r = ops.summarize_model("m", rounds, [0.1, 0.2, 0.3])
    assert r["this_over_other"]["oneDNN kernels (_Mkl*)"]["median"] == pytest.approx(1.2)
    assert r["this_over_other"]["other ops"]["median"] == pytest.approx(1.0)
    assert not r["this_over_other"]["step"]["noise"]
    assert r["medians"]["this"]["ops_ms"] == {"_MklNativeConv2D": 6, "Relu": 2}
    rounds[1]["this"]["ops_ms"]["_MklNativeConv2D"] = 18   # one round 50% off: noise
    assert ops.summarize_model("m", rounds, [0.1] * 3)["this_over_other"][
        "oneDNN kernels (_Mkl*)"]["noise"]


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
    found = phases.step_phases(phases.tensor_phases(phases.read_timeline(text)), skip=1)
    assert found["gradients"] == 2 and found["steps"] == 3
    assert found["step_ms"] == pytest.approx(0.1)
    assert found["phases_ms"] == pytest.approx({
        "NEGOTIATE_ALLREDUCE": 0.005, "ALLREDUCE": 0.02, "MEMCPY_IN_FUSION_BUFFER": 0.004,
        "MPI_ALLREDUCE": 0.01, "MEMCPY_OUT_FUSION_BUFFER": 0.003})
    # Control: the phase times summed over the gradients count the fused all-reduce twice.
    assert phases.covered([(5, 25), (5, 25)]) == 20 != (25 - 5) * 2
    assert phases.covered([(0, 10), (5, 15), (20, 30)]) == 25   # overlapping, then apart
    # Gradients all-reduced one by one, overlapping (Horovod's own optimizer): the phase
    # covers their union, not their sum.
    apart = [{"ph": p, "name": "ALLREDUCE", "ts": t + shift + (20 if p == "E" else 0),
              "pid": pid} for t in (0, 100, 200, 300) for pid, shift in ((0, 0), (1, 10))
             for p in ("B", "E")]
    found = phases.step_phases(phases.tensor_phases(apart), skip=0)
    assert found["phases_ms"]["ALLREDUCE"] == pytest.approx(0.03)
    # Too few steps past the warmup to time: said so, not a median of nothing.
    with pytest.raises(common.BenchError, match="too few"):
        phases.step_phases(phases.tensor_phases(phases.read_timeline(text)), skip=2)


def test_readme_block_is_replaced_and_a_missing_block_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{suite.BEGIN}\nold\n{suite.END}\nafter\n")
    text = readme.read_text()
    pattern_block = f"{suite.BEGIN}\nnew\n{suite.END}"
    suite.replace_block(readme, pattern_block)
    assert readme.read_text() == text.replace("\nold\n", "\nnew\n")
    (tmp_path / "plain.md").write_text("no markers\n")
    with pytest.raises(suite.UserError):
        suite.replace_block(tmp_path / "plain.md", pattern_block)


def test_the_results_block_comes_from_the_result_files_alone(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    machine = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "os": "os", "python": "3",
               "versions": {"tensorflow-cpu": "2.20.0", "keras": "3.15.1"},
               "load_average_1min_at_start": 0.123, "date_utc": "today"}
    (out / "tax.json").write_text(json.dumps({"machine": machine}))
    (out / "tax.md").write_text("| the tax table |\n")
    (out / "all.md").write_text("bench all took 1.0 min.\n")
    block = suite.results_block(out, tmp_path / "README.md", "make bench")
    assert "bench all took 1.0 min." in block and "| the tax table |" in block
    assert "TensorFlow 2.20.0, Keras 3.15.1" in block and "load 0.12 at start" in block
    assert "Not run (no `scaling.md`" in block   # control: a missing result says so
    assert "![tax](results/tax.png)" not in block   # no plot written, none linked


def test_an_efficiency_above_the_ceiling_is_flagged_as_noise():
    rows = [{"model": "m", "ranks": 1, "total_samples_per_sec": {"median": 100.0}},
            {"model": "m", "ranks": 2, "total_samples_per_sec": {"median": 200.0}},
            {"model": "m", "ranks": 4, "total_samples_per_sec": {"median": 440.0}}]
    scaling.add_efficiency(rows)
    assert [r["efficiency_above_ceiling"] for r in rows] == [False, False, True]
    assert scaling.efficiency_cell(rows[1]) == "1.0000: meets >= 0.95"
    assert scaling.efficiency_cell(rows[2]) == "1.1000 (above 1.05: noise)"
    rows[1]["total_samples_per_sec"]["median"] = 189.9  # 0.9495: a miss, printed as one
    scaling.add_efficiency(rows, {"m": 102.0})
    assert scaling.efficiency_cell(rows[1]) == "0.9495: misses >= 0.95"
    assert rows[0]["over_plain_fit"] == pytest.approx(100 / 102)
    assert "over_plain_fit" not in rows[1]


def test_a_ratio_just_under_its_target_prints_as_a_miss():
    # tax.md printed 0.9796 as "0.980" and a 9.8% spread as "10%": a miss of 0.98 hidden.
    close = common.ratio_summary([0.9796, 0.93, 1.026])
    assert close["spread"] == pytest.approx(0.098, abs=1e-4) and not close["noise"]
    assert common.ratio_cell(close, 0.98) == "0.9796 (spread 9.8%): misses >= 0.98"
    # Control: the same spread around a median at the target meets it.
    met = common.ratio_summary([0.98, 0.93, 1.026])
    assert common.ratio_cell(met, 0.98).endswith(": meets >= 0.98")
    # Past the spread limit the verdict is noise, whatever the median.
    wide = common.ratio_summary([0.99, 0.80, 1.02])
    assert common.ratio_cell(wide, 0.98).endswith(": noise: does not count")
    assert common.ratio_cell(wide) == "0.9900 (spread 22.2%) noise"
    assert common.verdict(3.5, 3.0, at_least=False) == "misses <= 3"


def test_the_stack_versions_are_the_measured_interpreters(tmp_path):
    import sys
    versions = common.stack_versions(sys.executable)
    assert versions["python_executable"] == sys.executable
    assert common.stack_line(versions).startswith("TensorFlow ")
    fake = tmp_path / "python"   # another venv: what its own interpreter reports
    fake.write_text('#!/bin/sh\necho \'{"tensorflow-cpu": "2.15.1", "keras": "2.15.0"}\'\n')
    fake.chmod(0o755)
    assert common.stack_line(common.stack_versions(str(fake))) == \
        "TensorFlow 2.15.1, Keras 2.15.0, Horovod none"
    assert common.machine(str(fake))["versions"]["keras"] == "2.15.0"


def test_the_paper_validation_reports_each_assumption_and_never_fits_one():
    latency, per_byte = 10e-6, 8 / 25e9
    # Control: no overlap and one buffer is the projection's own model.
    plain = project.step_seconds(0.5, 512, 178e6, latency, per_byte)
    assert plain["efficiency"] == pytest.approx(project.efficiency(0.5, 512, 178e6, latency,
                                                                   per_byte))
    # Four 64 MiB buffers pay the latency term four times; the bandwidth term is unchanged.
    fused = project.step_seconds(0.5, 512, 4 * 64 * 2 ** 20, latency, per_byte,
                                 fusion_bytes=64 * 2 ** 20)
    assert fused["buffers"] == 4 and fused["latency_s"] == pytest.approx(4 * 2 * 511 * latency)
    # Full overlap hides at most the backward pass (2/3 of the step).
    hidden = project.step_seconds(0.3, 512, 500e6, latency, per_byte, overlap=1.0)
    assert hidden["hidden_s"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        project.step_seconds(0.3, 2, 1e6, latency, per_byte, overlap=1.5)
    # The implied overlap gives back the published figure when fed in.
    phi = project.implied_overlap(0.5, plain["latency_s"] + plain["bandwidth_s"], 0.9)
    assert project.step_seconds(0.5, 512, 178e6, latency, per_byte,
                                overlap=phi)["efficiency"] == pytest.approx(0.9)
    v = project.validate_paper()
    rows = {r["model"]: r for r in v["rows"]}
    assert set(project.PUBLISHED) <= set(rows)
    for r in rows.values():
        base = r["variants"][next(iter(project.PAPER_VARIANTS))]
        assert base["difference_points"] == pytest.approx(
            100 * (base["efficiency"] - r["published"]))
        assert project.diagnose(r)


def test_peers_run_what_this_stack_cannot_in_the_other_venv(monkeypatch):
    stacks = {"k3": {"keras": "3.15.1"}, "k2": {"keras": "2.15.0"}}
    monkeypatch.setattr(peers.common, "stack_versions", lambda python: stacks[python])
    plan = peers.plan_systems("k3", "k2")
    assert plan["mwms"]["python"] == "k2" and plan["ps"]["python"] == "k2"
    assert plan["mwms"]["other_stack_because"] == peers.UNAVAILABLE_ON_KERAS3["mwms"]
    assert plan["hvdtrain"] == {"python": "k3"} and plan["hvdtrain-gloo"] == {"python": "k3"}
    # Control: without another venv they are marked, not run.
    assert "unavailable" in peers.plan_systems("k3", None)["mwms"]
    assert peers.plan_systems("k2", None)["mwms"] == {"python": "k2"}
    # Ratios pair the systems' runs round by round.
    runs = {"hvdtrain": [{"samples_per_sec": 100.0}, {"samples_per_sec": 50.0}],
            "hvdtrain-gloo": [{"samples_per_sec": 90.0}, {"samples_per_sec": 48.0}]}
    ratio = peers.per_round_ratio(runs, "hvdtrain-gloo", "hvdtrain")
    assert ratio["per_round"] == pytest.approx([0.9, 0.96])
    assert peers.per_round_ratio(runs, "hvdtrain", "mwms") is None


def test_a_slow_allreduce_is_timed_over_fewer_calls():
    # Control: a fast all-reduce keeps the size's cap (200 calls of 4 KiB, 3 of 64 MiB).
    assert allreduce.batch_ops(6e-6, allreduce.ops_per_batch(4 * allreduce.KIB)) == 200
    assert allreduce.batch_ops(0.05, allreduce.ops_per_batch(64 * allreduce.MIB)) == 3
    # Gloo with fusion off, 30 ms a call: half a second's worth, not 200 calls (6 s).
    assert allreduce.batch_ops(0.03, 200) == 17
    assert allreduce.batch_ops(2.0, 200) == 3


def test_the_allreduce_targets_count_1_to_16_mib_and_the_4_kib_floor():
    mib, kib = allreduce.MIB, allreduce.KIB
    row = lambda nbytes, seconds, ratio=None: {"bytes": nbytes, "seconds": {"median": seconds},
                                              **({} if ratio is None else {"of_raw_mpi": ratio})}
    raw = {"label": allreduce.RAW_MPI.label, "kind": "mpi4py",
           "rows": [row(4 * kib, 3e-6), row(mib, 1e-3), row(16 * mib, 1e-2), row(64 * mib, 5e-2)]}
    hvd = {"label": allreduce.HOROVOD_MPI.label, "kind": "horovod",
           "rows": [row(4 * kib, 9e-6, 0.3), row(mib, 1e-3, 0.95), row(16 * mib, 1e-2, 0.91),
                    row(64 * mib, 9e-2, 0.5)]}
    t = allreduce._target([raw, hvd])
    # 64 MiB is outside the window: its 0.5 does not count; the 4 KiB floor is 3x exactly.
    assert t["horovod_mpi_of_raw_mpi_min_in_window"] == pytest.approx(0.91)
    assert t["bandwidth_met"] and t["floor_met"]
    assert t["floor_time_over_raw_mpi"] == pytest.approx(3.0)
    # Control: a slower floor and a 16 MiB dip miss both.
    hvd["rows"][0]["seconds"]["median"] = 1e-5
    hvd["rows"][2]["of_raw_mpi"] = 0.89
    t = allreduce._target([raw, hvd])
    assert not t["bandwidth_met"] and not t["floor_met"] and t["worst_bytes"] == 16 * mib
    assert "misses >= 0.9" in allreduce.target_lines(t)[0]
    assert "misses <= 3" in allreduce.target_lines(t)[1]


def test_the_tables_print_the_verdicts():
    machine = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "os": "os", "python": "3",
               "versions": {"tensorflow-cpu": "2.20.0", "keras": "3.15.1"},
               "load_average_1min_at_start": 0.1, "date_utc": "today"}
    rounds = [{"plain": 100.0, "hvdtrain": 97.9}, {"plain": 100.0, "hvdtrain": 98.2},
              {"plain": 90.0, "hvdtrain": 88.0}]
    assert "Where a step's time goes" not in tax.markdown(tax_result(machine, rounds))
    for i, r in enumerate(rounds):   # each side's step breakdown, 50 + i ms and 0.0i ms
        for side in ("plain", "hvdtrain"):
            r[f"{side}_step"] = {"step_seconds_median": (50 + i) / 1e3,
                                 "between_steps_seconds_median": i / 1e5}
    rounds[2]["hvdtrain_step"]["step_seconds_median"] = 0.0612   # the median, not the mean
    assert "| m | keras3 | 51.00 | 51.00 | 0.010 | 0.010 |" in tax.markdown(
        tax_result(machine, rounds))
    taxed = tax_result(machine, rounds)
    assert "| 0.9790 (spread 0.4%): misses >= 0.98 |" in tax.markdown(taxed)
    assert "TensorFlow 2.20.0, Keras 3.15.1" in tax.markdown(taxed)
    measured = {1: [{"horovod": 10.0, "hvdtrain": 9.9, "ratio": 0.99}],
                2: [{"horovod": 15.0, "hvdtrain": 24.0, "ratio": 1.6}]}
    rows = versus_horovod.summarize_rounds(measured)
    assert common.ratio_cell(rows[0]["ratio"], rows[0]["target"]).endswith("misses >= 1")
    assert common.ratio_cell(rows[1]["ratio"], rows[1]["target"]).endswith("meets >= 1.5")
    assert rows[1]["hvdtrain_efficiency"]["median"] == pytest.approx(24.0 / (2 * 9.9))


def tax_result(machine: dict, rounds: list[dict]) -> dict:
    return {"machine": machine, "plan": {"rounds": len(rounds)}, "target": tax.TARGET,
            "results": [{"model": "m", "stack": "keras3", "stack_line": "tf 2.20",
                         "batch_size": 16, "rounds": rounds,
                         "load_average_before_each_round": [1, 2, 3],
                         "hvdtrain_over_plain": tax.ratio_summary(rounds)}],
            "stack_comparisons": []}


def test_the_tax_rounds_interleave_both_stacks():
    assert tax.round_order(0, ["this", "other"]) == [
        ("this", "plain"), ("this", "hvdtrain"), ("other", "plain"), ("other", "hvdtrain")]
    assert tax.round_order(1, ["this", "other"]) == tax.round_order(0, ["this", "other"])[::-1]
    assert tax.round_order(1, ["this"]) == [("this", "hvdtrain"), ("this", "plain")]


@pytest.mark.multirank
# Its checks are of sense, not of speed (rates above zero, figures recomputed from the rates,
# an efficiency above 1.05 flagged, Horovod's bus bandwidth below one core's memcpy, which it
# stays far under), so they hold on a busy machine; its figures do not, and make test
# publishes none.
@pytest.mark.timeout(900)
def test_quick_benchmarks_run_and_make_sense(tmp_path):
    out = tmp_path / "results"
    done = run_job(hvdtrain("bench", "all", "--quick", "--out", str(out)), timeout=840)
    assert_ok(done, "hvdtrain bench all --quick")
    for name in ("scaling", "tax", "allreduce", "peers", "project", "input"):
        for suffix in (".json", ".md", ".png"):
            assert (out / f"{name}{suffix}").stat().st_size > 0, f"{name}{suffix}"
    timed = json.loads((out / "all.json").read_text())
    assert [t["benchmark"] for t in timed["timings"]][:2] == ["scaling", "tax"], timed
    assert all(t["seconds"] > 0 for t in timed["timings"]) and timed["quick"], timed
    scaled = json.loads((out / "scaling.json").read_text())
    reduced = json.loads((out / "allreduce.json").read_text())
    check_scaling(scaled)
    check_allreduce(reduced)
    check_peers(json.loads((out / "peers.json").read_text()), (out / "peers.md").read_text())
    check_projection(json.loads((out / "project.json").read_text()), scaled, reduced)
    check_input(json.loads((out / "input.json").read_text()), (out / "input.md").read_text())
    check_tax(json.loads((out / "tax.json").read_text()))
    check_a_slow_rank_lowers_the_efficiency(tmp_path / "slow", scaled)
    check_ops(tmp_path / "ops")
    check_phases(tmp_path / "phases")


def check_phases(out) -> None:
    """``bench phases --quick`` (not in bench all): the 2-rank MLP job's timeline held every
    gradient once a step, and each phase of their all-reduce took a part of the step."""
    done = run_job(hvdtrain("bench", "phases", "--quick", "--out", str(out)), timeout=300)
    assert_ok(done, "hvdtrain bench phases --quick")
    timed = json.loads((out / "phases.json").read_text())
    (model,) = timed["results"]
    for r in model["rounds"]:
        job = r["this"]
        assert job["gradients"] >= 2, job   # the MLP's: a kernel and a bias per layer
        assert job["steps"] >= 3 and job["samples_per_sec"] > 0, job
        assert 0 < job["phases_ms"]["ALLREDUCE"] < job["step_ms"], job


def check_ops(out) -> None:
    """``bench ops --quick`` (not in bench all): each round profiled the MLP's steps after
    the first of one epoch, found its matrix products among the ops, and its ops took part of
    the profiled step, not more."""
    done = run_job(hvdtrain("bench", "ops", "--quick", "--out", str(out)), timeout=300)
    assert_ok(done, "hvdtrain bench ops --quick")
    profiled = json.loads((out / "ops.json").read_text())
    (model,) = profiled["results"]
    assert len(model["rounds"]) == profiled["plan"]["rounds"] >= 2
    for r in model["rounds"]:
        job = r["this"]
        assert job["profiled_steps"] == scaling.QUICK.steps_per_repeat, job
        assert any("MatMul" in kind for kind in job["ops_ms"]), job["ops_ms"]
        assert 0 < sum(job["ops_ms"].values()) < job["profiled_step_ms"], job
        assert job["step_ms"] > 0


def check_tax(taxed: dict) -> None:
    """The plain baseline trains the same model as hvdtrain (its parameter count), each round
    measures both, and the ratio is recomputed from the rounds."""
    for result in taxed["results"]:
        rounds = result["rounds"]
        assert len(rounds) == taxed["plan"]["rounds"] >= 2
        for r in rounds:
            assert r["plain_params"] == r["hvdtrain_params"] > 0, r
            assert r["plain"] > 0 and r["hvdtrain"] > 0, r
            for side in ("plain", "hvdtrain"):   # the breakdown: a part of a step
                step = r[f"{side}_step"]
                assert 0 < step["between_steps_seconds_median"] < step["step_seconds_median"], r
        ratio = result["hvdtrain_over_plain"]
        assert ratio["per_round"] == pytest.approx([r["hvdtrain"] / r["plain"] for r in rounds])


def check_peers(compared: dict, markdown: str) -> None:
    rows = {r["system"]: r for r in compared["results"]}
    assert set(rows) == set(peers.SYSTEMS)
    # tf.distribute's multi-worker fit cannot run on Keras 3: marked so, with the reason, in
    # the result and its table; everything else ran.
    not_run = {"mwms", "ps"} if keras_major() >= 3 else set()
    for system, r in rows.items():
        if system in not_run:
            assert r["unavailable"] and r["unavailable"] == peers.unavailable(system), r
            assert f"not run: {r['unavailable']}" in markdown, system
            continue
        assert "unavailable" not in r, r
        assert r["samples_per_sec"]["median"] > 0 and r["final_eval_accuracy"] > 0.5, r
        assert len(r["rounds"]) == compared["rounds"], r
    gloo = compared["gloo_over_mpi"]
    assert gloo["per_round"] == pytest.approx([
        g["samples_per_sec"] / m["samples_per_sec"]
        for g, m in zip(rows["hvdtrain-gloo"]["rounds"], rows["hvdtrain"]["rounds"])])


SLOW_RANK_DELAY_S = 0.2


def check_a_slow_rank_lowers_the_efficiency(out, scaled: dict) -> None:
    """The 2-rank MLP run again with rank 1 sleeping before each step: every step then waits
    for rank 1, so the total rate cannot exceed 2 x batch per delay, and the weak-scaling
    efficiency (against the same 1-rank rate) falls below the normal run's."""
    done = run_job(hvdtrain("bench", "scaling", "--quick", "--world-sizes", "2", "--out",
                            str(out)), timeout=300,
                   env={scaling.SLOW_RANK_ENV: f"1:{SLOW_RANK_DELAY_S}"})
    assert_ok(done, "hvdtrain bench scaling --quick, rank 1 slow")
    normal = {r["ranks"]: r for r in scaled["results"]}
    (slow,) = json.loads((out / "scaling.json").read_text())["results"]
    rate = slow["total_samples_per_sec"]["median"]
    assert rate <= 2 * slow["batch_size_per_rank"] / SLOW_RANK_DELAY_S, slow
    efficiency = scaling.weak_scaling_efficiency(rate, 2, normal[1]["total_samples_per_sec"][
        "median"])
    assert efficiency < normal[2]["weak_scaling_efficiency"], (efficiency, normal[2])
    # The step breakdown sees the sleep where it is: between rank 1's steps, not rank 0's.
    between = [r["between_steps_seconds_median"] for r in slow["raw"]]
    assert between[1] >= SLOW_RANK_DELAY_S > 10 * between[0], between


def check_scaling(scaled: dict) -> None:
    rows = {r["ranks"]: r for r in scaled["results"]}
    assert set(rows) == {1, 2}
    for ranks, row in rows.items():
        assert len(row["raw"]) == ranks                     # every rank reported its own count
        assert row["total_samples_per_sec"]["median"] > 0
        assert_total_is_every_ranks_samples_over_the_slowest_time(row)
        # The same budget at every N: one core and one intra-op thread per rank, recorded.
        assert len(row["core_budget"]) == ranks and all(
            len(b["cores"]) == 1 and b["intra_op_threads"] == 1 for b in row["core_budget"])
        # hvdtrain's launch defaults, as the ranks found them (a rank alone: a long cycle).
        assert row["rank_env"]["OMPI_MCA_mpi_yield_when_idle"] == "1"
        assert row["rank_env"]["HOROVOD_CYCLE_TIME"] == ("5" if ranks == 1 else "0.2")
    e = rows[2]["weak_scaling_efficiency"]
    assert e == pytest.approx(rows[2]["total_samples_per_sec"]["median"]
                              / (2 * rows[1]["total_samples_per_sec"]["median"]))
    # Above 1.05 is noise: then the figure must say so (the run is not failed for it).
    assert e > 0 and rows[2]["efficiency_above_ceiling"] == (e > 1.05), rows[2]
    if e > 1.05:
        warnings.warn(f"weak-scaling efficiency {e:.2f} at 2 ranks: noise, flagged as such")


def assert_total_is_every_ranks_samples_over_the_slowest_time(row: dict) -> None:
    """The row's total rate recomputed from its ranks' raw counts, repeat by repeat: the
    samples of all ranks over the slowest rank's seconds (the arithmetic of
    test_total_rate_is_the_sum_..., here on a real run's figures)."""
    raw = row["raw"]
    repeats = {len(r["samples"]) for r in raw} | {len(r["seconds"]) for r in raw}
    assert len(repeats) == 1, raw                           # every rank timed every repeat
    totals = [sum(r["samples"][i] for r in raw) / max(r["seconds"][i] for r in raw)
              for i in range(repeats.pop())]
    total = row["total_samples_per_sec"]
    assert (total["n"], total["median"], total["min"], total["max"]) == pytest.approx(
        (len(totals), statistics.median(totals), min(totals), max(totals)), rel=1e-12), (
        total, totals)


def check_allreduce(reduced: dict) -> None:
    paths = {p["label"]: p for p in reduced["paths"]}
    assert set(paths) == {allreduce.RAW_MPI.label, allreduce.HOROVOD_MPI.label,
                          allreduce.HOROVOD_GLOO.label}
    memcpy = {r["bytes"]: r["GBps"] for r in reduced["memcpy"]}
    assert sorted(memcpy) == list(allreduce.QUICK_SIZES) and all(v > 0 for v in memcpy.values())
    for path in paths.values():
        assert [r["bytes"] for r in path["rows"]] == list(allreduce.QUICK_SIZES), path["label"]
        for r in path["rows"]:
            assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["seconds"]["median"] / 1e9)
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2 ranks: 2(N-1)/N = 1
            assert r["busbw_GBps"] > 0
            if path["kind"] == "horovod":  # no faster than one core copies memory
                assert r["busbw_GBps"] <= memcpy[r["bytes"]], (path["label"], r)


def check_projection(projected: dict, scaled: dict, reduced: dict) -> None:
    """Every projected figure recomputed from the measured ones it is built on."""
    hvd_mpi = next(p for p in reduced["paths"] if p["label"] == allreduce.HOROVOD_MPI.label)
    smallest = min(hvd_mpi["rows"], key=lambda r: r["bytes"])
    fast = max(r["busbw_GBps"] for r in hvd_mpi["rows"] if r["bytes"] >= allreduce.MIB)
    measured = projected["links"]["this machine (measured Horovod/MPI)"]
    assert measured["latency_s"] == pytest.approx(smallest["seconds"]["median"] / 2)  # 2(N-1)
    assert measured["seconds_per_byte"] == pytest.approx(1 / (fast * 1e9))
    one_rank = {r["model"]: r for r in scaled["results"] if r["ranks"] == 1}
    assert projected["rows"] and {r["model"] for r in projected["rows"]} == set(one_rank)
    for row in projected["rows"]:
        source = one_rank[row["model"]]
        assert row["params"] == source["raw"][0]["params"]
        assert row["compute_s"] == pytest.approx(
            source["batch_size_per_rank"] / source["total_samples_per_sec"]["median"])
        link, t_c, size = projected["links"][row["link"]], row["compute_s"], 4 * row["params"]
        for n in projected["ranks"]:
            ring = 2 * (n - 1) * link["latency_s"] + 2 * (n - 1) / n * size * link[
                "seconds_per_byte"]
            assert row["efficiency"][str(n)] == pytest.approx(t_c / (t_c + ring)), (row, n)


def check_input(result: dict, markdown: str) -> None:
    """``bench input`` (quick: the MLP's step against every source's pipeline)."""
    rows = result["results"]
    assert {r["source"] for r in rows} == set(input_bench.SOURCES)
    assert {r["model"] for r in rows} == {"mlp"} and len(rows) == len(input_bench.SOURCES)
    for r in rows:
        assert r["pipeline_samples_per_sec"]["min"] > 0 and r["step_samples_per_sec"]["min"] > 0
        assert r["ratio"] > 0 and r["meets_goal"] == (r["ratio"] >= input_bench.GOAL)
    assert result["threads"] == 1 and len(result["cores"]) == 1   # one rank's budget
    assert "| mlp | 8x8x1, 32 | images |" in markdown


def test_time_to_95_verdicts_are_per_round_ratios_with_their_spread():
    def rows(ours: list, single: list) -> dict:
        return {"results": [
            {"system": "hvdtrain", "rounds": [{"seconds_to_95": s} for s in ours]},
            {"system": "single", "rounds": [{"seconds_to_95": s} for s in single]},
            {"system": "mwms", "unavailable": "keras#20585"}]}
    faster, mwms = peers.time_verdicts(rows([1.0, 1.1, 0.9], [2.0, 2.2, 1.8]))
    assert faster.endswith("(3 of 3 rounds): 0.5000 (spread 0.0%): meets <= 1"), faster
    assert mwms == "hvdtrain against mwms: mwms not run"
    # Controls: slower in every round misses; rounds that disagree are noise, whatever the
    # median; a round where one side never reached 95% is left out, and said so.
    assert peers.time_verdicts(rows([2.0, 2.0], [1.0, 1.0]))[0].endswith("misses <= 1")
    noisy = peers.time_verdicts(rows([1.0, 1.0, 1.0], [2.0, 1.2, 0.8]))[0]
    assert noisy.endswith("noise: does not count"), noisy
    assert "(1 of 2 rounds)" in peers.time_verdicts(rows([1.0, None], [2.0, 2.0]))[0]
